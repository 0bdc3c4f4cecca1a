"""Memory phase logging: one line per rank at the phases that matter (`MEM:START`, `MEM:POST-IMPORT`, ...).

    log_memory("POST-MODEL")     # host RSS from /proc/self/status; GPU numbers once CUDA is initialised

GPU numbers are read only when CUDA is already initialised (asking earlier would create the context the
line is meant to observe). docs/rank.md.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from podguard.rank._env import current_rank, emit
from podguard.units import MIB

_PHASE_RE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class MemorySample:
    phase: str
    rank: int
    rss_bytes: int | None  # resident set now (VmRSS)
    rss_peak_bytes: int | None  # high-water mark (VmHWM)
    gpu_allocated_bytes: int | None = None  # None when CUDA is not initialised in this process
    gpu_reserved_bytes: int | None = None
    gpu_peak_bytes: int | None = None

    def line(self) -> str:
        parts = [
            f"[rank {self.rank}] MEM:{self.phase}",
            f"rss={_mib(self.rss_bytes)}",
            f"rss_peak={_mib(self.rss_peak_bytes)}",
        ]
        if self.gpu_allocated_bytes is not None:
            parts += [
                f"gpu_alloc={_mib(self.gpu_allocated_bytes)}",
                f"gpu_reserved={_mib(self.gpu_reserved_bytes)}",
                f"gpu_peak={_mib(self.gpu_peak_bytes)}",
            ]
        return " ".join(parts)


def read_host_memory(status_path: str | Path = "/proc/self/status") -> tuple[int | None, int | None]:
    """(VmRSS, VmHWM) in bytes from /proc; (None, None) where /proc is not there (not Linux)."""
    rss = hwm = None
    try:
        text = Path(status_path).read_text()
    except OSError:
        return None, None
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                value = int(fields[1]) * 1024  # the kernel reports kB
                if line.startswith("VmRSS:"):
                    rss = value
                else:
                    hwm = value
    return rss, hwm


def sample_memory(phase: str, *, rank: int | None = None) -> MemorySample:
    """Measure without printing. GPU numbers only if torch is imported and CUDA initialised already."""
    clean = _PHASE_RE.sub("-", phase.strip()).strip("-").upper() or "UNNAMED"
    rss, hwm = read_host_memory()
    alloc = reserved = peak = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                alloc = int(torch.cuda.memory_allocated())
                reserved = int(torch.cuda.memory_reserved())
                peak = int(torch.cuda.max_memory_allocated())
        except Exception:  # a broken CUDA state must not turn a log line into a crash
            pass
    return MemorySample(clean, current_rank() if rank is None else rank, rss, hwm, alloc, reserved, peak)


def log_memory(phase: str, *, rank: int | None = None) -> MemorySample:
    """Print `[rank R] MEM:<PHASE> rss=... rss_peak=... [gpu_alloc=... gpu_reserved=... gpu_peak=...]`."""
    sample = sample_memory(phase, rank=rank)
    emit(sample.line())
    return sample


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f}MiB"

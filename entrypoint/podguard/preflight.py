"""The preflight: cleanup -> detect -> select -> gate, with a JSON report and a short human summary.

`train`, `run`, `health` and `cleanup` all go through `run_preflight`. It never imports torch (the CUDA
probe runs in a child process) and never sleeps for a fixed time: every wait polls a condition with a
deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from podguard.selection import Selection


@dataclass(frozen=True)
class PreflightOptions:
    # selection
    gpu_list: str | None = None  # GPU_LIST: indices or UUIDs
    cuda_visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as the user set it
    nproc_per_node: str | None = None  # NPROC_PER_NODE: override and cap (raw, validated here)
    expect_gpus: str | None = None  # --expect-gpus / RUNPOD_GPU_COUNT (raw, validated here)
    on_fewer: str = "fail"  # "fail" (exit 69) or "continue" (loudly) when fewer GPUs than expected
    require_gpu: bool = False  # no GPU at all -> 69 instead of CPU fallback
    # cleanup
    cleanup: bool = True
    dry_run: bool = False
    busy_timeout_s: float = 60.0
    grace_s: float = 10.0
    protect: tuple[str, ...] = ()  # extra protected process names (added to the built-in list)
    kill_patterns: tuple[str, ...] = ()  # names that widen the search to job trees of real holders
    idle_memory_mib: int = 512  # memory used (NVML v2) at or below this with no process = idle
    # health gate
    probe: str = "auto"  # "cuda", "off", or "auto" (cuda where torch+CUDA are available)
    probe_cmd: str | None = None
    probe_timeout_s: float = 60.0
    xid_window_s: float = 0.0  # extra time to watch XID events when no probe runs
    max_temperature_margin_c: int = 0  # warn when temperature >= slowdown - margin
    fail_on_warnings: bool = False
    # where
    state_dir: Path | None = None
    dev_dir: Path = Path("/dev")
    command: str = "preflight"  # which podguard command ran it, recorded in the report
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PreflightResult:
    exit_code: int  # 0, 64, 69, 75, 76
    selection: Selection | None
    report_path: Path | None
    summary: str  # the short human summary that was printed
    message: str = ""  # one-line reason when exit_code != 0

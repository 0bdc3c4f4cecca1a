"""The preflight's options: one frozen record, its defaults (the only place they live), its validation.

opts = PreflightOptions(command="health", gpu_list="0,1", probe="off")
validate_options(opts)  # UsageError (exit 64) naming the bad value, before anything is done
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from podguard.errors import DEFAULT_GRACE_S, UsageError
from podguard.preflight.gate.degraded import DegradedPolicy

__all__ = ["DEFAULT_GRACE_S", "DegradedPolicy", "OnFewer", "PreflightOptions", "ProbeMode", "validate_options"]


class ProbeMode(StrEnum):
    AUTO = "auto"  # cuda where torch with CUDA is importable in a child, else off
    CUDA = "cuda"  # per GPU, in parallel: checked matmul, matmul_tflops, mem_gbps, h2d_gbps
    FULL = "full"  # cuda, then one all-reduce across the selected GPUs: allreduce_busbw_gbps
    OFF = "off"


class OnFewer(StrEnum):
    FAIL = "fail"  # exit 69
    CONTINUE = "continue"  # run on what is there, loudly


@dataclass(frozen=True)
class PreflightOptions:
    """Everything `run_preflight` needs; the CLI builds it from the parameter table in `cli/params.py`."""

    # selection
    gpu_list: str | None = None  # GPU_LIST: indices or UUIDs
    cuda_visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as the user set it
    nproc_per_node: int | None = None  # NPROC_PER_NODE: override and cap
    expect_gpus: int | None = None  # --expect-gpus / RUNPOD_GPU_COUNT
    on_fewer: OnFewer = OnFewer.FAIL
    require_gpu: bool = False  # no GPU at all -> 69 instead of CPU fallback
    # cleanup
    cleanup: bool = True
    dry_run: bool = False
    busy_timeout_s: float = 60.0
    grace_s: float = DEFAULT_GRACE_S
    protect: tuple[str, ...] = ()  # extra protected process names (added to the built-in list)
    kill_patterns: tuple[str, ...] = ()  # names that widen the search to job trees of real holders
    idle_memory_mib: int = 512  # memory used (NVML v2) at or below this with no process = idle
    # health gate
    probe: ProbeMode = ProbeMode.AUTO
    probe_cmd: str | None = None
    probe_timeout_s: float = 60.0
    xid_window_s: float = 0.0  # extra time to watch XID events when no probe runs
    max_temperature_margin_c: int = 0  # warn when temperature >= slowdown - margin
    fail_on_warnings: bool = False
    degraded: DegradedPolicy = DegradedPolicy.FAIL  # what a degraded GPU does: fail (76), warn, exclude
    slow_ratio: float = 0.8  # a probe metric below this x the node's median is a slow GPU
    # where
    state_dir: Path | None = None
    dev_dir: Path = Path("/dev")
    command: str = "preflight"  # which podguard command ran it, recorded in the report
    # leases: concurrent runs on one host get disjoint GPUs (train/run lease; cleanup skips leased GPUs)
    lease: bool = False
    wait_for_gpus: bool = False
    lease_dir: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)


def validate_options(opts: PreflightOptions) -> None:
    """Reject bad configuration before anything is done (no half-done actions). UsageError, exit 64."""
    probe = str(opts.probe)
    if probe not in ProbeMode.__members__.values():
        valid = ", ".join(m.value for m in ProbeMode)
        raise UsageError(f"PODGUARD_PROBE={probe!r} is not valid; choose one of: {valid}")
    if str(opts.degraded) not in DegradedPolicy.__members__.values():
        valid = ", ".join(m.value for m in DegradedPolicy)
        raise UsageError(f"PODGUARD_DEGRADED={str(opts.degraded)!r} is not valid; choose one of: {valid}")
    if not 0 <= opts.slow_ratio <= 1:
        raise UsageError(f"PODGUARD_SLOW_RATIO={opts.slow_ratio:g} is not valid; expected a number from 0 (off) to 1")
    if str(opts.on_fewer) not in OnFewer.__members__.values():
        valid = ", ".join(m.value for m in OnFewer)
        raise UsageError(f"on-fewer-gpus={str(opts.on_fewer)!r} is not valid; choose one of: {valid}")
    for name, value in (
        ("busy-timeout", opts.busy_timeout_s),
        ("grace", opts.grace_s),
        ("probe-timeout", opts.probe_timeout_s),
        ("xid-window", opts.xid_window_s),
    ):
        if not (0 <= value < float("inf")):
            raise UsageError(f"--{name}={value:g} is not valid; expected a finite number of seconds >= 0")
    if opts.probe_timeout_s == 0 and probe != ProbeMode.OFF:
        raise UsageError("--probe-timeout=0 is not valid with a probe; expected seconds > 0 (or PODGUARD_PROBE=off)")
    if opts.idle_memory_mib < 0:
        raise UsageError(f"--idle-memory-mib={opts.idle_memory_mib} is not valid; expected an integer >= 0")
    if opts.probe_cmd is not None:
        _check_probe_cmd(opts.probe_cmd)
    if not opts.dev_dir.is_dir():
        raise UsageError(f"PODGUARD_DEV_DIR={str(opts.dev_dir)!r} is not a directory; expected e.g. /dev")


def _check_probe_cmd(probe_cmd: str) -> None:
    try:
        argv = shlex.split(probe_cmd)
    except ValueError as exc:
        raise UsageError(f"PODGUARD_PROBE_CMD={probe_cmd!r} cannot be parsed: {exc}") from None
    if not argv:
        raise UsageError("PODGUARD_PROBE_CMD is empty; give a program to run per GPU (exit 0 = healthy)")
    if shutil.which(argv[0]) is None:
        raise UsageError(f"PODGUARD_PROBE_CMD={probe_cmd!r}: program {argv[0]!r} not found on PATH")

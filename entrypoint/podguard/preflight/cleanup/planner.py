"""Who holds the selected GPUs, and which processes a cleanup may stop: NVML's word cross-checked with /proc.

    plan = plan_cleanup(backend, [0, 1], dev_dir="/dev", protect=("my-notebook",))
    plan.targets   # launcher first, then its tree top-down; plan.skipped says who was left alone and why

`build_plan` is the pure decision procedure, a sequence of small checks that each return data:
fd evidence -> NVML cross-check -> holders -> roots of their job trees -> merged trees -> targets ->
pattern report. The rules and their reasons: docs/cleanup.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from podguard.errors import UsageError
from podguard.gpu.backend import GpuBackend, GpuProcess, GpuQueryError, GpuSnapshot
from podguard.preflight.cleanup.devices import resolve_dev_dir
from podguard.preflight.cleanup.evidence import NvmlLists, fd_evidence, find_holders, gpu_list, nvml_crosscheck, short
from podguard.preflight.cleanup.policy import Policy
from podguard.preflight.cleanup.process_table import ProcessTable, scan_processes
from podguard.preflight.cleanup.trees import choose_roots, merge_trees, pattern_skips, tree_targets
from podguard.preflight.cleanup.vocabulary import CleanupPlan, PlanConfig, SkipCode
from podguard.preflight.selection import mig_scope

__all__ = ["build_plan", "gpu_list", "mig_scope", "minor_numbers", "nvml_processes", "plan_cleanup", "replan", "short"]


def build_plan(
    table: ProcessTable,
    nvml: NvmlLists,
    config: PlanConfig,
    *,
    respawners: Mapping[int, int] | None = None,
    t_start: float | None = None,
) -> CleanupPlan:
    """The decision procedure, without any I/O beyond reading /proc for command lines (docs/cleanup.md).

    `nvml` maps every NVML GPU index to NVML's process list for it (for a MIG GPU: the processes of its
    selected MIG devices); `respawners` maps pid -> start time of processes seen respawning a holder.
    """
    t0 = time.perf_counter() if t_start is None else t_start
    respawners = respawners or {}
    policy = Policy(table, config)
    fd = fd_evidence(table, config)
    check = nvml_crosscheck(table, nvml, fd)
    holders, skips = find_holders(table, fd, check, config)
    roots = choose_roots(table, holders, policy, config, respawners)
    skips += roots.skips
    merged = merge_trees(table, roots.roots)
    trees, claimed, left_out = tree_targets(table, merged, holders, roots, policy, respawners)
    skips += left_out
    # A holder of an unselected GPU inside a selected job's tree goes with its job: not "skipped".
    gone_with_job = (SkipCode.UNSELECTED_GPU, SkipCode.UNMAPPED_DEVICE, SkipCode.FD_ONLY)
    skips = [s for s in skips if not (s.pid in claimed and s.code in gone_with_job)]
    skips += pattern_skips(table, policy, claimed, {s.pid for s in skips})
    unique = {(s.pid, s.code): s for s in reversed(skips)}  # the first reason given for a (pid, code) wins
    return CleanupPlan(
        config=config,
        holders=tuple(holders[k] for k in sorted(holders)),
        trees=tuple(trees),
        skipped=tuple(sorted(unique.values(), key=lambda s: (s.pid, s.code))),
        foreign=tuple(check.foreign),
        monitors=tuple(sorted(fd.monitors)),
        uninspectable=table.uninspectable,
        scan_ms=table.scan_ms,
        plan_ms=(time.perf_counter() - t0) * 1000.0,
    )


# --------------------------------------------------------------------------------------------------
# Reading NVML and planning


def minor_numbers(backend: GpuBackend, snapshots: Mapping[int, GpuSnapshot] | None = None) -> dict[int, int]:
    """NVML index -> device minor number (`/dev/nvidia<minor>`); the index itself where NVML cannot say."""
    out: dict[int, int] = {}
    for i in range(backend.device_count()):
        snap = snapshots.get(i) if snapshots else None
        if snap is None:
            try:
                snap = backend.snapshot(i)
            except Exception:  # a lost GPU: assume the usual minor == index
                snap = None
        minor = snap.minor_number if snap is not None else None
        out[i] = i if minor is None else minor
    return out


def nvml_processes(
    backend: GpuBackend, indices: Iterable[int], mig: Mapping[int, Sequence[str]] | None = None
) -> dict[int, tuple[GpuProcess, ...]]:
    """NVML's process lists per GPU (per selected MIG device on a MIG GPU). A list that cannot be read
    contributes none here; the wait for idle reports it as unknown."""
    out: dict[int, tuple[GpuProcess, ...]] = {}
    mig = mig or {}
    for i in indices:
        procs: list[GpuProcess] = []
        for device in mig.get(i) or (None,):
            try:
                procs.extend(backend.processes(i, mig=device) if device else backend.processes(i))
            except (GpuQueryError, IndexError, RuntimeError, OSError):
                continue
        out[i] = tuple(procs)
    return out


def plan_cleanup(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    dev_dir: str | os.PathLike[str] | None = None,
    protect: Sequence[str] = (),
    patterns: Sequence[str] = (),
    self_pid: int | None = None,
    uid: int | None = None,
    all_gpus: bool = False,
    snapshots: Mapping[int, GpuSnapshot] | None = None,
    minors: Mapping[int, int] | None = None,
    mig: Mapping[int, Sequence[str]] | None = None,
    leased: Mapping[int, str] | None = None,
    table: ProcessTable | None = None,
) -> CleanupPlan:
    """Find who holds the selected GPUs and plan what to stop; stops nothing.

    `dev_dir` defaults to `$PODGUARD_DEV_DIR` or `/dev`; `self_pid` to this process (a caller acting
    for another process passes that one); `uid` to the effective uid. `snapshots` (from the preflight's
    inventory) or `minors` avoid asking NVML again for minor numbers. `mig` names the MIG devices
    selected per MIG GPU (default: all of a MIG GPU's devices). `leased` maps the pids of other live
    podguard runs holding GPU leases to a description: their processes are never touched. Raises
    `UsageError` for a GPU index NVML does not have or an invalid pattern.
    """
    t0 = time.perf_counter()
    count = backend.device_count()
    gpus = tuple(dict.fromkeys(int(g) for g in gpu_indices))
    for g in gpus:
        if not 0 <= g < count:
            valid = f"0-{count - 1}" if count else "none: no GPU"
            raise UsageError(f"GPU index {g} is out of range (valid: {valid})")
    me = os.getpid() if self_pid is None else int(self_pid)
    config = PlanConfig(
        gpus=gpus,
        dev_dir=str(resolve_dev_dir(dev_dir)),
        protect=tuple(protect),
        patterns=tuple(patterns),
        self_pid=me,
        uid=os.geteuid() if uid is None else int(uid),
        all_gpus=all_gpus,
        minors=dict(minors) if minors is not None else minor_numbers(backend, snapshots),
        mig=mig_scope(snapshots, mig),
        leased={int(pid): who for pid, who in (leased or {}).items() if int(pid) != me},
    )
    return replan(config, backend, table=table, t_start=t0)


def replan(
    config: PlanConfig,
    backend: GpuBackend,
    *,
    table: ProcessTable | None = None,
    respawners: Mapping[int, int] | None = None,
    t_start: float | None = None,
) -> CleanupPlan:
    """Scan again and plan with the same configuration (used between kill rounds to catch respawns)."""
    t0 = time.perf_counter() if t_start is None else t_start
    nvml = nvml_processes(backend, sorted(config.minors) or range(backend.device_count()), config.mig)
    if table is None:
        table = scan_processes(Path(config.dev_dir))
    return build_plan(table, nvml, config, respawners=respawners, t_start=t0)

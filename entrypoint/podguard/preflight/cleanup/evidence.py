"""Steps 1-3 of a cleanup plan: which local processes hold which GPUs, by what evidence.

    fd = fd_evidence(table, config)                 # device files each process has open
    check = nvml_crosscheck(table, nvml_lists, fd)  # NVML's word against the fds; foreign PIDs
    holders, skipped = find_holders(table, fd, check, config)

The evidence rules and why: docs/cleanup.md ("Evidence").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from podguard.gpu.backend import GpuProcess
from podguard.preflight.cleanup.process_table import ProcessTable, ProcInfo
from podguard.preflight.cleanup.vocabulary import Evidence, ForeignProcess, Holder, PlanConfig, SkipCode, Skipped

__all__ = [
    "FdEvidence",
    "NvmlCheck",
    "NvmlLists",
    "fd_evidence",
    "find_holders",
    "gpu_list",
    "nvml_crosscheck",
    "short",
    "skip_record",
]

NvmlLists = Mapping[int, Sequence[GpuProcess]]


def short(command: str, limit: int = 160) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def gpu_list(gpus: Iterable[int]) -> str:
    return ",".join(f"GPU{g}" for g in gpus) or "no GPU"


def skip_record(p: ProcInfo, code: SkipCode, reason: str, gpus: tuple[int, ...] = ()) -> Skipped:
    return Skipped(p.pid, short(p.safe_command), code, reason, gpus)


@dataclass
class FdEvidence:
    """Step 1: which GPUs' device files each local process has open."""

    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)  # pid -> NVML indices
    unmapped: dict[int, tuple[str, ...]] = field(default_factory=dict)  # pid -> device files of no GPU
    monitors: list[int] = field(default_factory=list)  # only nvidiactl / nvidia-uvm open


def fd_evidence(table: ProcessTable, config: PlanConfig) -> FdEvidence:
    index_of_minor = {minor: index for index, minor in config.minors.items()}
    out = FdEvidence()
    for p in table:
        if not p.devices or p.pid == config.self_pid:
            continue
        minors = p.gpu_minors
        if not minors:
            out.monitors.append(p.pid)
            continue
        gpus = tuple(sorted({index_of_minor[m] for m in minors if m in index_of_minor}))
        lost = tuple(f"nvidia{m}" for m in minors if m not in index_of_minor)
        if gpus:
            out.gpus[p.pid] = gpus
        if lost:
            out.unmapped[p.pid] = lost
    return out


@dataclass
class NvmlCheck:
    """Step 2: NVML's lists checked against the fds: listed holders, unreadable ones, foreign PIDs."""

    listed: dict[int, set[int]] = field(default_factory=dict)  # pid -> GPUs where NVML and the fds agree
    unreadable: dict[int, set[int]] = field(default_factory=dict)  # pid -> GPUs (NVML lists it, fds EACCES)
    memory: dict[int, dict[int, int | None]] = field(default_factory=dict)
    foreign: list[ForeignProcess] = field(default_factory=list)

    def other_namespace_only(self, gpu: int) -> bool:
        """NVML lists processes on `gpu`, none of them a local holder: it speaks another PID namespace."""
        on_gpu = any(f.gpu == gpu for f in self.foreign)
        return on_gpu and not any(gpu in gpus for gpus in (*self.listed.values(), *self.unreadable.values()))


def nvml_crosscheck(table: ProcessTable, nvml: NvmlLists, fd: FdEvidence) -> NvmlCheck:
    out = NvmlCheck()
    for gpu in sorted(nvml):
        for gp in nvml[gpu]:
            p = table.get(gp.pid)
            if p is None:
                out.foreign.append(ForeignProcess(gp.pid, gpu, gp.used_memory, "not in this PID namespace"))
                continue
            mem = out.memory.setdefault(gp.pid, {})
            if not p.inspected or gpu in fd.gpus.get(gp.pid, ()):
                (out.listed if p.inspected else out.unreadable).setdefault(gp.pid, set()).add(gpu)
                known = mem.get(gpu)
                mem[gpu] = gp.used_memory if known is None else known + (gp.used_memory or 0)
                continue
            held = fd.gpus.get(gp.pid)
            what = (
                f"holds {gpu_list(held)} but not GPU{gpu}'s device file" if held else "holds no NVIDIA GPU device file"
            )
            out.foreign.append(
                ForeignProcess(
                    gp.pid,
                    gpu,
                    gp.used_memory,
                    f"local pid {gp.pid} {what}: NVML's pid is from another PID namespace",
                    short(p.safe_command),
                )
            )
    return out


def _holder(p: ProcInfo, gpus: Iterable[int], check: NvmlCheck, evidence: Evidence) -> Holder:
    gpus = tuple(sorted(set(gpus)))
    mem = {g: check.memory.get(p.pid, {}).get(g) for g in gpus}
    devices = p.devices if evidence is not Evidence.NVML else ()
    return Holder(
        p.pid, short(p.safe_command), p.display_name, gpus, mem, evidence, devices, p.uid, p.start_time, p.ppid
    )


def find_holders(
    table: ProcessTable, fd: FdEvidence, check: NvmlCheck, config: PlanConfig
) -> tuple[dict[int, Holder], list[Skipped]]:
    """Step 3: the holders. Device-file evidence alone counts only below a process NVML lists on that GPU
    (a forked DataLoader worker), or, where NVML lists only PIDs of another PID namespace on that GPU, with a
    CUDA context open (nvidia-uvm: a process that merely initialised NVML has none); never on a MIG-enabled
    GPU (every slice opens the same file)."""
    holders: dict[int, Holder] = {}
    skips: list[Skipped] = []
    for pid, gpus in check.listed.items():
        holders[pid] = _holder(table.procs[pid], gpus, check, Evidence.BOTH)
    for pid, gpus in fd.gpus.items():
        if pid in holders:
            continue
        p = table.procs[pid]
        ancestors = table.ancestors(pid)
        inherited = [g for g in gpus if g not in config.mig and any(g in check.listed.get(a, ()) for a in ancestors)]
        cuda = [g for g in gpus if g not in config.mig and "nvidia-uvm" in p.devices and check.other_namespace_only(g)]
        if inherited:
            holders[pid] = _holder(p, inherited, check, Evidence.FD)
        elif cuda:
            holders[pid] = _holder(p, cuda, check, Evidence.FD_CUDA)
        elif config.all_gpus or set(gpus) & set(config.gpus):
            shown = tuple(g for g in gpus if config.all_gpus or g in config.gpus)
            skips.append(
                skip_record(
                    p,
                    SkipCode.FD_ONLY,
                    f"has {gpu_list(shown)}'s device file open, but NVML lists neither it nor a parent of it on "
                    "that GPU (a process that only initialised NVML, or one on another MIG slice): not stopped",
                    shown,
                )
            )
    for pid, gpus in check.unreadable.items():
        p = table.procs[pid]
        holders[pid] = _holder(p, gpus, check, Evidence.NVML)
        why = (
            f"NVML lists it on {gpu_list(sorted(gpus))} but its fds cannot be read here "
            f"({p.fd_error}); not stopped on NVML's word alone"
        )
        skips.append(skip_record(p, SkipCode.UNINSPECTABLE, why, tuple(sorted(gpus))))
    for pid, devs in fd.unmapped.items():
        if pid not in holders:
            skips.append(
                skip_record(
                    table.procs[pid],
                    SkipCode.UNMAPPED_DEVICE,
                    f"holds {', '.join(devs)}, which NVML reports as no GPU here",
                )
            )
    return holders, skips

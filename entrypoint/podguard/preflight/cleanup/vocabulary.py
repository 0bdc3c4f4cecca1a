"""The cleanup's codes (StrEnums) and frozen records: what was planned, done, left alone and seen.

    plan.targets[0].role is Role.LAUNCHER
    result.to_dict()  # the JSON the preflight report carries (podguard.records)

Every record serialises through `podguard.records`; memory is bytes in the records, MiB in the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from podguard.gpu.backend import GpuProcess
from podguard.records import OMIT, Record, as_mib, as_ms, in_mib, renamed

__all__ = [
    "CleanupPlan",
    "CleanupResult",
    "Evidence",
    "ForeignProcess",
    "GpuIdleState",
    "GpuState",
    "Holder",
    "JobTree",
    "KillRecord",
    "Outcome",
    "PlanConfig",
    "Respawner",
    "Role",
    "SkipCode",
    "Skipped",
    "Target",
]


class Evidence(StrEnum):
    """Why a process counts as a holder of a GPU."""

    BOTH = "both"  # NVML lists it on the GPU and it has the GPU's device file open
    FD = "fd"  # device file open, below a process NVML lists on that GPU (a forked DataLoader worker)
    # Device file and a CUDA context (nvidia-uvm) open, on a GPU where NVML lists only PIDs of another PID
    # namespace (a container that sees host PIDs): NVML cannot name local processes there at all.
    FD_CUDA = "fd_cuda"
    NVML = "nvml"  # NVML lists it, its fds cannot be read here: reported, never stopped


class SkipCode(StrEnum):
    """Why a process that was considered is left alone (stable for machines)."""

    PID1 = "pid1"
    SELF = "self"
    ANCESTOR = "ancestor"
    PROTECTED = "protected"
    OTHER_USER = "other_user"
    LEASED = "leased"  # under another live podguard run's lease
    UNSELECTED_GPU = "unselected_gpu"
    UNMAPPED_DEVICE = "unmapped_device"
    UNINSPECTABLE = "uninspectable"
    FD_ONLY = "fd_only"  # device file open, but no process NVML lists on that GPU above it
    PATTERN_OUTSIDE_TREE = "pattern_outside_tree"
    RESPAWN_LIMIT = "respawn_limit"


# The codes that mean "may never be signalled, whatever the evidence" (the never-touch rules).
NEVER_TOUCH = frozenset(
    {SkipCode.PID1, SkipCode.SELF, SkipCode.ANCESTOR, SkipCode.PROTECTED, SkipCode.OTHER_USER, SkipCode.LEASED}
)


class Role(StrEnum):
    """A target's place in its job tree."""

    LAUNCHER = "launcher"  # the root, holds no GPU itself (torchrun, a process-group leader, ...)
    RESPAWNER = "respawner"  # the root because it was seen starting a new holder after one was stopped
    HOLDER = "holder"
    MEMBER = "member"  # any other process of the tree


class Outcome(StrEnum):
    """What happened to one target."""

    TERMINATED = "terminated"  # exited after SIGTERM
    KILLED = "killed"  # needed SIGKILL
    GONE = "gone"  # had exited before it was signalled, or its PID was reused
    UNKILLABLE = "unkillable"  # still there after SIGKILL (D state: stuck in the driver)
    NOT_PERMITTED = "not_permitted"  # EPERM


class GpuState(StrEnum):
    """Where one GPU stands at the end of a wait."""

    IDLE = "idle"
    BUSY = "busy"  # a local holder is still there (protected, unkillable, respawned, another run's, ...)
    PHANTOM = "phantom"  # memory held, no holder visible in this PID namespace
    UNKNOWN = "unknown"  # NVML could not answer (no permission, not supported, GPU lost): never idle


@dataclass(frozen=True)
class Holder(Record):
    """A local process that holds GPUs. `memory` is NVML's figure per GPU in bytes (None: not listed)."""

    pid: int
    cmdline: str  # redacted
    name: str
    gpus: tuple[int, ...]
    memory: dict[int, int | None] = field(hash=False, metadata=as_mib("memory_mib"))
    evidence: Evidence = Evidence.BOTH
    devices: tuple[str, ...] = ()
    uid: int | None = None
    start_time: int = field(default=0, metadata=OMIT)
    ppid: int = field(default=0, metadata=OMIT)


@dataclass(frozen=True)
class ForeignProcess(Record):
    """A PID NVML reports on a GPU that is not provably a local holder of that GPU. Never stopped."""

    pid: int
    gpu: int
    used_memory: int | None = field(metadata=as_mib("memory_mib"))
    reason: str
    local_cmdline: str | None = None  # the unrelated local process that happens to have this PID (redacted)


@dataclass(frozen=True)
class Target(Record):
    """A process the plan stops. `start_time` guards against PID reuse between planning and signalling."""

    pid: int
    start_time: int = field(metadata=OMIT)
    cmdline: str  # redacted
    name: str
    role: Role
    tree: int  # pid of its job tree's root
    reason: str
    gpus: tuple[int, ...] = ()  # GPUs it holds itself
    memory: dict[int, int | None] = field(default_factory=dict, hash=False, metadata=as_mib("memory_mib"))
    uid: int | None = field(default=None, metadata=OMIT)
    parent: int = 0  # ppid at scan time (for the root: whoever started the job)
    parent_start: int = field(default=0, metadata=OMIT)


@dataclass(frozen=True)
class JobTree(Record):
    """One job to stop: targets in signal order (root first, then descendants top-down)."""

    root: int
    targets: tuple[Target, ...]
    holders: tuple[int, ...]  # the holders that led here


@dataclass(frozen=True)
class Skipped(Record):
    """A process that was considered and deliberately not stopped, with the reason."""

    pid: int
    cmdline: str  # redacted
    code: SkipCode
    reason: str
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class PlanConfig(Record):
    """Everything needed to plan again (after a kill round) exactly as the first time."""

    gpus: tuple[int, ...]
    dev_dir: str
    protect: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    self_pid: int = 0
    uid: int = 0  # effective uid podguard runs as; 0 may signal anyone
    all_gpus: bool = False
    minors: dict[int, int] = field(default_factory=dict, hash=False)  # NVML index -> device minor
    mig: dict[int, tuple[str, ...]] = field(default_factory=dict, hash=False)  # MIG GPU -> its selected devices
    leased: dict[int, str] = field(default_factory=dict, hash=False)  # other live podguard runs: pid -> who


@dataclass(frozen=True)
class CleanupPlan(Record):
    """What a cleanup would stop, in order, and everything it saw and left alone, with reasons."""

    config: PlanConfig
    holders: tuple[Holder, ...]
    trees: tuple[JobTree, ...]
    skipped: tuple[Skipped, ...]
    foreign: tuple[ForeignProcess, ...]
    monitors: tuple[int, ...]  # hold nvidiactl / nvidia-uvm only: not holders of any GPU
    uninspectable: tuple[int, ...]  # fds not readable here (EACCES): nothing is assumed about them
    scan_ms: float = field(default=0.0, metadata=OMIT)  # reading /proc
    plan_ms: float = field(default=0.0, metadata=OMIT)  # the whole planning, NVML queries and the scan included

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(t for tree in self.trees for t in tree.targets)

    @property
    def empty(self) -> bool:
        return not self.trees

    def derived(self) -> dict[str, Any]:
        return {"timings_ms": {"scan": round(self.scan_ms, 3), "plan": round(self.plan_ms, 3)}}


@dataclass(frozen=True)
class KillRecord(Record):
    """What happened to one target; `exit_ms` is from its first signal to its exit."""

    pid: int
    cmdline: str  # redacted
    name: str
    role: Role
    tree: int
    gpus: tuple[int, ...]
    memory: dict[int, int | None] = field(hash=False, metadata=as_mib("memory_mib"))
    reason: str
    round: int
    outcome: Outcome
    signals: tuple[str, ...] = ()
    exit_ms: float | None = field(default=None, metadata=as_ms())
    state: str | None = None  # /proc state when unkillable
    parent: int = 0  # its parent when planned
    note: str = field(default="", metadata=OMIT)  # what to do about it (unkillable: restart the pod)

    @property
    def stopped(self) -> bool:
        return self.outcome in (Outcome.TERMINATED, Outcome.KILLED)


@dataclass(frozen=True)
class Respawner(Record):
    """A process seen starting a new holder of a selected GPU after its previous child was stopped."""

    pid: int
    cmdline: str  # redacted
    children: tuple[int, ...]  # the holders it started again
    gpus: tuple[int, ...]
    stopped: bool = False  # it was stopped as the root of a later round
    reason: str = ""  # why it was left running, when it was


@dataclass(frozen=True)
class GpuIdleState(Record):
    """Where one GPU stands at the end of a wait."""

    index: int
    state: GpuState
    memory_used: int | None = field(metadata=as_mib("memory_used_mib"))  # bytes, NVML v2 "used"
    processes: tuple[GpuProcess, ...] = ()  # NVML's list at the end
    holders: tuple[int, ...] = ()  # local pids with its device file open at the end (busy only)
    detail: str = ""
    waited_ms: float = field(default=0.0, metadata=as_ms())  # from the start of the wait until idle (or deadline)

    @property
    def idle(self) -> bool:
        return self.state is GpuState.IDLE


@dataclass(frozen=True)
class CleanupResult(Record):
    """Everything a cleanup did and saw; `to_dict()` is what goes into the JSON report."""

    dry_run: bool
    gpus: tuple[int, ...]
    plan: CleanupPlan = field(metadata=OMIT)  # the first plan (in a dry run: exactly what would be done)
    actions: tuple[KillRecord, ...] = field(metadata=OMIT)
    skipped: tuple[Skipped, ...] = ()
    foreign: tuple[ForeignProcess, ...] = ()
    states: dict[int, GpuIdleState] = field(default_factory=dict, hash=False, metadata=renamed("gpu_states"))
    rounds: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict, hash=False, metadata=as_ms())
    recommendations: tuple[str, ...] = ()
    respawners: tuple[Respawner, ...] = ()

    @property
    def planned(self) -> tuple[Target, ...]:
        return self.plan.targets

    @property
    def killed(self) -> tuple[KillRecord, ...]:
        return tuple(a for a in self.actions if a.stopped)

    @property
    def unkillable(self) -> tuple[KillRecord, ...]:
        return tuple(a for a in self.actions if a.outcome is Outcome.UNKILLABLE)

    @property
    def phantom(self) -> dict[int, int | None]:
        """GPU index -> bytes still used with no holder visible here."""
        return {i: s.memory_used for i, s in self.states.items() if s.state is GpuState.PHANTOM}

    @property
    def busy(self) -> tuple[int, ...]:
        return tuple(i for i, s in sorted(self.states.items()) if not s.idle)

    @property
    def ok(self) -> bool:
        return all(s.idle for s in self.states.values())

    def derived(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "planned": list(self.planned),
            "killed": list(self.killed),
            "unkillable": [{**a.to_dict(), "reason": a.note or a.reason} for a in self.unkillable],
            "other_actions": [a for a in self.actions if not a.stopped and a.outcome is not Outcome.UNKILLABLE],
            "phantom_mib": in_mib(self.phantom),
            "plan": self.plan,
        }

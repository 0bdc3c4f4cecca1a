"""Who holds the GPUs, and which processes a cleanup may stop: NVML's word cross-checked with /proc.

Why: the seed scripts killed by name pattern and "whatever has /dev/nvidia* open", which takes out the
entrypoint, sshd, a notebook, and is fooled by host PIDs NVML reports from other containers. Here
nothing is stopped on NVML's word alone, and nothing is stopped that is not in the job tree of a
process that provably holds a selected GPU's device file in this PID namespace.

Rules (each decision carries its reason into the plan and the report):

* Evidence. A local process that has `<dev_dir>/nvidia<N>` open holds the GPU whose NVML minor number
  is N (minor == index when NVML cannot tell), whether NVML lists it or not (forked DataLoader
  children inherit the fds but have no context of their own). A process with only `nvidiactl` /
  `nvidia-uvm` open (a monitor) holds no GPU. An NVML-listed PID that does not exist here, or that
  exists here but does not have that GPU's device file open, is "foreign" (a PID of another PID
  namespace): reported, never stopped. An NVML-listed PID whose fds we may not read is reported as
  uninspectable, not stopped. podguard's own NVML handles do not make it a holder.
* Never touched: PID 1, podguard itself, its ancestors up to PID 1, and protected processes
  (`BUILTIN_PROTECTED` plus the caller's `protect` globs, matched against the process's names: comm
  (what `prctl(PR_SET_NAME)` sets), argv[0], and the script or `-m` module an interpreter runs). The
  built-in list also holds GPU monitors (nvidia-smi, DCGM, nvtop, another podguard), which open
  `nvidia<N>` through NVML without a context. Processes of other users are reported, not stopped,
  unless podguard runs as root. A holder only of GPUs outside the selection is left alone (unless
  `all_gpus`); a job that holds any selected GPU is stopped whole, its other GPUs included.
* Job tree. For each holder H to stop, the root of its job tree is found by climbing parent by parent
  from H; the climb goes to the parent P only while P is none of: PID 1, podguard or one of its
  ancestors, protected, another user's (when not root), a zombie, an interactive shell; and P is:
    1. a GPU holder itself (a rank that forked H), or
    2. a launcher: a name in `BUILTIN_LAUNCHERS` (torchrun, torch.distributed.run, accelerate,
       deepspeed, mpirun, ...; a module `pkg.sub` matches `pkg`) or a caller pattern (a regex searched
       in the full command line, as the seeds' name patterns were). A shell is a launcher only by a
       caller pattern, and only when it runs a script or `-c` (never somebody's terminal), or
    3. in H's process group, when that group's leader is H or one of H's ancestors and is itself
       none of the excluded kinds above and not a shell (so a container's PID-1 shell, whose group
       every background process inherits, never turns everything into one job).
  The climb stops at the first parent that does not qualify: no process is skipped over, so it
  cannot reach an unrelated ancestor. The tree is the root and all its descendants (minus never-touch
  and protected processes and their subtrees). A tree that contains another tree's root absorbs it.
  Stopping the launcher first is what keeps a torchrun agent from respawning the worker just killed.
* Patterns only widen: a process that matches a caller pattern but is not in the job tree of a real
  holder is reported ("pattern_outside_tree") and never touched.

Public API: `plan_cleanup(backend, gpu_indices, *, dev_dir, protect, patterns, self_pid, ...) ->
CleanupPlan` (reads NVML through the backend and /proc), `replan(config, backend)` (the same again),
the pure `build_plan(table, nvml, config) -> CleanupPlan` they call, and `describe_holders(...)` (the
read-only view `podguard doctor` prints). Records: `Holder`, `ForeignProcess`, `Target`, `JobTree`,
`Skipped`, `PlanConfig`, `CleanupPlan`.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from podguard.errors import UsageError
from podguard.gpu.backend import GpuBackend, GpuProcess, GpuSnapshot
from podguard.preflight.cleanup.procfs import ProcessTable, ProcInfo, resolve_dev_dir, scan_processes
from podguard.units import describe_memory
from podguard.units import mib as _mib

# Globs matched against a process's names. Sessions people work in, init/supervisors, and GPU monitors
# (which open nvidia<N> through NVML without having a CUDA context).
BUILTIN_PROTECTED: tuple[str, ...] = (
    "sshd",
    "sshd-session",
    "sshd-auth",
    "dropbear",
    "jupyter",
    "jupyter-*",
    "jupyterhub*",
    "ipykernel*",
    "code-server",
    "vscode-server*",
    "tmux*",
    "screen",
    "SCREEN",
    "nginx",
    "tini",
    "dumb-init",
    "catatonit",
    "supervisord",
    "s6-svscan",
    "s6-supervise",
    "runsvdir",
    "runsv",
    "systemd",
    "init",
    "containerd",
    "containerd-shim*",
    "dockerd",
    "runc",
    "cron",
    "crond",
    "nvidia-smi",
    "nvidia-persistenced",
    "nv-hostengine",
    "dcgm*",
    "nvtop",
    "nvitop",
    "gpustat",
    "podguard",
)

# Names of programs that start and babysit GPU workers (and may respawn them).
BUILTIN_LAUNCHERS: tuple[str, ...] = (
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate",
    "accelerate-launch",
    "deepspeed",
    "mpirun",
    "mpiexec",
    "orterun",
    "prterun",
    "prted",
    "hydra_pmi_proxy",
    "horovodrun",
)


class Evidence(StrEnum):
    """Why a process counts as a holder: NVML lists it, it has the device file open, or both."""

    NVML = "nvml"  # listed by NVML, fds unreadable here: reported, never stopped
    FD = "fd"
    BOTH = "both"


@dataclass(frozen=True)
class Holder:
    """A local process that holds GPUs. `memory` is NVML's figure per GPU in bytes (None: not listed)."""

    pid: int
    cmdline: str
    name: str
    gpus: tuple[int, ...]
    memory: dict[int, int | None] = field(hash=False)
    evidence: Evidence
    devices: tuple[str, ...] = ()
    uid: int | None = None
    start_time: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "cmdline": self.cmdline,
            "name": self.name,
            "gpus": list(self.gpus),
            "memory_mib": {str(g): _mib(m) for g, m in self.memory.items()},
            "evidence": self.evidence.value,
            "devices": list(self.devices),
            "uid": self.uid,
        }


@dataclass(frozen=True)
class ForeignProcess:
    """A PID NVML reports on a GPU that is not provably a local holder of that GPU. Never stopped."""

    pid: int
    gpu: int
    used_memory: int | None
    reason: str
    local_cmdline: str | None = None  # the unrelated local process that happens to have this PID

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "gpu": self.gpu,
            "memory_mib": _mib(self.used_memory),
            "reason": self.reason,
            "local_cmdline": self.local_cmdline,
        }


@dataclass(frozen=True)
class Target:
    """A process the plan stops. `start_time` guards against PID reuse between planning and signalling."""

    pid: int
    start_time: int
    cmdline: str
    name: str
    role: str  # "launcher" (root that holds no GPU), "holder", "member" (other process in the tree)
    tree: int  # pid of its job tree's root
    reason: str
    gpus: tuple[int, ...] = ()  # GPUs it holds itself
    memory: dict[int, int | None] = field(default_factory=dict, hash=False)
    uid: int | None = None
    parent: int = 0  # ppid at scan time (for the root: whoever started the job)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "cmdline": self.cmdline,
            "name": self.name,
            "parent": self.parent,
            "role": self.role,
            "tree": self.tree,
            "reason": self.reason,
            "gpus": list(self.gpus),
            "memory_mib": {str(g): _mib(m) for g, m in self.memory.items()},
        }


@dataclass(frozen=True)
class JobTree:
    """One job to stop: targets in signal order (root first, then descendants top-down)."""

    root: int
    targets: tuple[Target, ...]
    holders: tuple[int, ...]  # the holders that led here

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "holders": list(self.holders),
            "targets": [t.to_dict() for t in self.targets],
        }


@dataclass(frozen=True)
class Skipped:
    """A process that was considered and deliberately not stopped. `code` is stable for machines:
    pid1, self, ancestor, protected, other_user, unselected_gpu, unmapped_device, uninspectable,
    pattern_outside_tree, respawn_limit."""

    pid: int
    cmdline: str
    code: str
    reason: str
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "cmdline": self.cmdline,
            "code": self.code,
            "reason": self.reason,
            "gpus": list(self.gpus),
        }


@dataclass(frozen=True)
class PlanConfig:
    """Everything needed to plan again (after a kill round) exactly as the first time."""

    gpus: tuple[int, ...]
    dev_dir: str
    protect: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    self_pid: int = 0
    uid: int = 0  # effective uid podguard runs as; 0 may signal anyone
    all_gpus: bool = False
    minors: dict[int, int] = field(default_factory=dict, hash=False)  # NVML index -> device minor

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": list(self.gpus),
            "dev_dir": self.dev_dir,
            "protect": list(self.protect),
            "patterns": list(self.patterns),
            "self_pid": self.self_pid,
            "uid": self.uid,
            "all_gpus": self.all_gpus,
            "minors": {str(k): v for k, v in self.minors.items()},
        }


@dataclass(frozen=True)
class CleanupPlan:
    """What a cleanup would stop, in order, and everything it saw and left alone, with reasons."""

    config: PlanConfig
    holders: tuple[Holder, ...]
    trees: tuple[JobTree, ...]
    skipped: tuple[Skipped, ...]
    foreign: tuple[ForeignProcess, ...]
    monitors: tuple[int, ...]  # hold nvidiactl / nvidia-uvm only: not holders of any GPU
    uninspectable: tuple[int, ...]  # fds not readable here (EACCES): nothing is assumed about them
    scan_ms: float = 0.0  # reading /proc
    plan_ms: float = 0.0  # the whole planning, NVML queries and the scan included

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(t for tree in self.trees for t in tree.targets)

    @property
    def empty(self) -> bool:
        return not self.trees

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "holders": [h.to_dict() for h in self.holders],
            "trees": [t.to_dict() for t in self.trees],
            "skipped": [s.to_dict() for s in self.skipped],
            "foreign": [f.to_dict() for f in self.foreign],
            "monitors": list(self.monitors),
            "uninspectable": list(self.uninspectable),
            "timings_ms": {"scan": round(self.scan_ms, 3), "plan": round(self.plan_ms, 3)},
        }


def _short(command: str, limit: int = 160) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def _gpu_list(gpus: Iterable[int]) -> str:
    return ",".join(f"GPU{g}" for g in gpus) or "no GPU"


class _Matcher:
    """Protected globs, launcher names and caller regexes, compiled once per plan."""

    def __init__(self, protect: Sequence[str], patterns: Sequence[str]) -> None:
        globs = [*BUILTIN_PROTECTED, *(p for p in protect if p)]
        # Most protected names are plain words: a set lookup, no regex to compile on every preflight.
        self.protect_names = {g for g in globs if not any(c in g for c in "*?[")}
        self.protect = [(g, re.compile(fnmatch.translate(g))) for g in globs if g not in self.protect_names]
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for pat in patterns:
            if not pat:
                continue
            try:
                self.patterns.append((pat, re.compile(pat)))
            except re.error as exc:
                raise UsageError(
                    f"kill pattern {pat!r} is not a valid regular expression ({exc}); "
                    "patterns are regular expressions searched in full command lines, e.g. 'sglang' or 'python.*train'"
                ) from None

    def protected(self, p: ProcInfo) -> str | None:
        for name in p.names:
            if name in self.protect_names:
                return name
        for glob, rx in self.protect:
            for name in p.names:
                if rx.match(name):
                    return glob
        return None

    def pattern(self, p: ProcInfo) -> str | None:
        if not self.patterns:
            return None
        text = p.command
        for pat, rx in self.patterns:
            if rx.search(text) or rx.search(p.comm):
                return pat
        return None

    def launcher(self, p: ProcInfo) -> str | None:
        """Why `p` is a launcher, or None. Shells only by a caller pattern, and never interactive ones."""
        if p.is_shell:
            return None if p.interactive_shell else self.pattern(p)
        for name in p.names:
            for known in BUILTIN_LAUNCHERS:
                if name == known or name.startswith(known + "."):
                    return known
        return self.pattern(p)


class Policy:
    """Who may never be signalled, for one process table and configuration (shared with the executor,
    which applies the same rule to processes that appear in a job tree while it is being stopped)."""

    def __init__(self, table: ProcessTable, config: PlanConfig) -> None:
        self.config = config
        self.match = _Matcher(config.protect, config.patterns)
        self.never: dict[int, str] = {1: "pid1", 0: "pid1", config.self_pid: "self"}
        for anc in table.ancestors(config.self_pid):
            self.never.setdefault(anc, "ancestor")

    def excluded(self, p: ProcInfo) -> tuple[str, str] | None:
        """(code, text) saying why `p` may never be signalled, or None."""
        if p.pid in self.never:
            code = self.never[p.pid]
            text = {
                "pid1": "PID 1 (the container's init)",
                "self": "podguard itself",
                "ancestor": "an ancestor of podguard",
            }[code]
            return code, text
        glob = self.match.protected(p)
        if glob is not None:
            return "protected", f"protected process (matches {glob!r})"
        uid = self.config.uid
        if uid != 0 and p.uid is not None and p.uid != uid:
            return "other_user", f"owned by uid {p.uid}; podguard runs as uid {uid}, not root"
        return None


def _index_of_minor(minors: Mapping[int, int]) -> dict[int, int]:
    return {minor: index for index, minor in minors.items()}


def build_plan(
    table: ProcessTable,
    nvml: Mapping[int, Sequence[GpuProcess]],
    config: PlanConfig,
    *,
    t_start: float | None = None,
) -> CleanupPlan:
    """The decision procedure, without any I/O beyond reading /proc for command lines (see module doc).

    `nvml` maps every NVML GPU index to NVML's process list for it; `config.minors` maps each index to
    its device minor number.
    """
    t0 = time.perf_counter() if t_start is None else t_start
    policy = Policy(table, config)
    match = policy.match
    never = policy.never
    excluded = policy.excluded
    selected = set(config.gpus)
    index_of_minor = _index_of_minor(config.minors)
    self_pid = config.self_pid

    skipped: dict[tuple[int, str], Skipped] = {}

    def skip(p: ProcInfo, code: str, reason: str, gpus: tuple[int, ...] = ()) -> None:
        skipped.setdefault((p.pid, code), Skipped(p.pid, _short(p.command), code, reason, gpus))

    # 1. Local fd evidence.
    local_gpus: dict[int, tuple[int, ...]] = {}
    unmapped: dict[int, tuple[str, ...]] = {}
    monitors: list[int] = []
    for p in table:
        if not p.devices:
            continue
        minors = p.gpu_minors
        if not minors:
            if p.pid != self_pid:
                monitors.append(p.pid)
            continue
        gpus = tuple(sorted({index_of_minor[m] for m in minors if m in index_of_minor}))
        lost = tuple(f"nvidia{m}" for m in minors if m not in index_of_minor)
        if gpus:
            local_gpus[p.pid] = gpus
        if lost:
            unmapped[p.pid] = lost

    # 2. NVML cross-check.
    memory: dict[int, dict[int, int | None]] = {}
    nvml_listed: set[int] = set()
    foreign: list[ForeignProcess] = []
    nvml_only: dict[int, set[int]] = {}
    for gpu in sorted(nvml):
        for gp in nvml[gpu]:
            p = table.get(gp.pid)
            if p is None:
                foreign.append(ForeignProcess(gp.pid, gpu, gp.used_memory, "not in this PID namespace"))
            elif not p.inspected:
                nvml_only.setdefault(gp.pid, set()).add(gpu)
                memory.setdefault(gp.pid, {})[gpu] = gp.used_memory
            elif gpu in local_gpus.get(gp.pid, ()):
                nvml_listed.add(gp.pid)
                memory.setdefault(gp.pid, {})[gpu] = gp.used_memory
            elif gp.pid in local_gpus:
                foreign.append(
                    ForeignProcess(
                        gp.pid,
                        gpu,
                        gp.used_memory,
                        f"local pid {gp.pid} holds {_gpu_list(local_gpus[gp.pid])} but not GPU{gpu}'s "
                        "device file: NVML's pid is from another PID namespace",
                        _short(p.command),
                    )
                )
            else:
                foreign.append(
                    ForeignProcess(
                        gp.pid,
                        gpu,
                        gp.used_memory,
                        f"local pid {gp.pid} holds no NVIDIA GPU device file: NVML's pid is from another PID namespace",
                        _short(p.command),
                    )
                )

    holders: dict[int, Holder] = {}
    for pid, gpus in local_gpus.items():
        if pid == self_pid:
            continue  # podguard's own NVML handles
        p = table.procs[pid]
        mem = {g: memory.get(pid, {}).get(g) for g in gpus}
        evidence = Evidence.BOTH if pid in nvml_listed else Evidence.FD
        holders[pid] = Holder(
            pid, _short(p.command), _display_name(p), gpus, mem, evidence, p.devices, p.uid, p.start_time
        )
    for pid, gpus_set in nvml_only.items():
        p = table.procs[pid]
        gpus = tuple(sorted(gpus_set))
        holders[pid] = Holder(
            pid, _short(p.command), _display_name(p), gpus, dict(memory[pid]), Evidence.NVML, (), p.uid, p.start_time
        )
        skip(
            p,
            "uninspectable",
            f"NVML lists it on {_gpu_list(gpus)} but its fds cannot be read here "
            f"({p.fd_error}); not stopped on NVML's word alone",
            gpus,
        )
    for pid, devs in unmapped.items():
        p = table.procs[pid]
        if pid not in holders and pid != self_pid:
            skip(p, "unmapped_device", f"holds {', '.join(devs)}, which NVML reports as no GPU here")

    # 3. Which holders to stop, and the root of each one's job tree.
    roots: dict[int, list[int]] = {}
    climb_why: dict[int, str] = {}
    for pid in sorted(holders):
        h = holders[pid]
        p = table.procs[pid]
        if h.evidence is Evidence.NVML:
            continue
        why_not = excluded(p)
        if why_not is not None:
            code, text = why_not
            skip(p, code, f"holds {_gpu_list(h.gpus)} but is {text}: not stopped", h.gpus)
            continue
        if not config.all_gpus and not selected.intersection(h.gpus):
            skip(p, "unselected_gpu", f"holds only {_gpu_list(h.gpus)}, outside the selection", h.gpus)
            continue
        root = _climb(table, p, holders, never, match, excluded, climb_why)
        roots.setdefault(root, []).append(pid)

    # 4. Merge nested trees, then list each tree's members top-down.
    root_set = set(roots)
    merged: dict[int, list[int]] = {}
    for root in sorted(roots):
        top = root
        for anc in table.ancestors(root):
            if anc in root_set:
                top = anc
        merged.setdefault(top, []).extend(roots[root])

    trees: list[JobTree] = []
    claimed: set[int] = set()
    for root in sorted(merged):
        members = [root, *_members(table, root, excluded, skip, root)]
        targets: list[Target] = []
        tree_holders = tuple(sorted(set(merged[root])))
        for pid in members:
            if pid in claimed:
                continue
            claimed.add(pid)
            p = table.procs[pid]
            h = holders.get(pid)
            gpus = h.gpus if h else ()
            mem = dict(h.memory) if h else {}
            if h is not None:
                role = "holder"
                reason = _holder_reason(h, selected)
                if pid == root and pid in climb_why:
                    reason += f"; root of the job tree ({climb_why[pid]})"
            elif pid == root:
                role = "launcher"
                reason = f"launcher of holder(s) {', '.join(map(str, tree_holders))} ({climb_why.get(pid, 'root')})"
            else:
                role = "member"
                reason = f"in the job tree of {root} ({_short(table.procs[root].command, 60)})"
            targets.append(
                Target(
                    pid, p.start_time, _short(p.command), _display_name(p), role, root, reason, gpus, mem, p.uid, p.ppid
                )
            )
        if targets:
            trees.append(JobTree(root, tuple(targets), tree_holders))

    # A holder of an unselected GPU inside a selected job's tree goes with its job: not "skipped".
    for key in [k for k in skipped if k[0] in claimed and k[1] in ("unselected_gpu", "unmapped_device")]:
        del skipped[key]

    # 5. Patterns only widen: report matches outside every tree.
    if match.patterns:
        for p in table:
            if p.pid in claimed or p.pid in never or p.kernel_thread or p.zombie:
                continue
            if any(key[0] == p.pid for key in skipped):
                continue
            pat = match.pattern(p)
            if pat is not None:
                skip(
                    p,
                    "pattern_outside_tree",
                    f"matches pattern {pat!r} but is not in the job tree of any "
                    "process holding a selected GPU: not stopped",
                )

    elapsed = (time.perf_counter() - t0) * 1000.0
    return CleanupPlan(
        config=config,
        holders=tuple(holders[k] for k in sorted(holders)),
        trees=tuple(trees),
        skipped=tuple(sorted(skipped.values(), key=lambda s: (s.pid, s.code))),
        foreign=tuple(foreign),
        monitors=tuple(sorted(monitors)),
        uninspectable=table.uninspectable,
        scan_ms=table.scan_ms,
        plan_ms=elapsed,
    )


def _display_name(p: ProcInfo) -> str:
    return os.path.basename(p.cmdline[0]) if p.cmdline else p.comm


def _holder_reason(h: Holder, selected: set[int]) -> str:
    parts = []
    for g in h.gpus:
        mem = h.memory.get(g)
        note = f"NVML {describe_memory(mem)}" if mem is not None else "not listed by NVML"
        parts.append(f"GPU{g} (nvidia device file open; {note})")
    text = "holds " + ", ".join(parts)
    outside = [g for g in h.gpus if g not in selected]
    if outside:
        text += f"; {_gpu_list(outside)} outside the selection go with its job"
    return text


def _climb(
    table: ProcessTable,
    h: ProcInfo,
    holders: Mapping[int, Holder],
    never: Mapping[int, str],
    match: _Matcher,
    excluded: Any,
    why: dict[int, str],
) -> int:
    """The root of `h`'s job tree (see the module doc for the rule). Records why each step was taken."""
    chain = table.ancestors(h.pid)
    leader = table.get(h.pgid)
    group_ok = (
        leader is not None
        and (leader.pid == h.pid or leader.pid in chain)
        and leader.pid not in never
        and not leader.is_shell
        and excluded(leader) is None
    )
    cur = h
    for ppid in chain:
        parent = table.get(ppid)
        if parent is None or parent.zombie or parent.interactive_shell:
            break
        if excluded(parent) is not None:
            break
        if ppid in holders and holders[ppid].evidence is not Evidence.NVML:
            reason = "holds a GPU itself"
        elif (name := match.launcher(parent)) is not None:
            reason = f"matches launcher {name!r}"
        elif group_ok and parent.pgid == h.pgid and not parent.is_shell:
            reason = f"same process group {h.pgid} as holder {h.pid}"
        else:
            break
        why.setdefault(ppid, reason)
        cur = parent
    return cur.pid


def _members(table: ProcessTable, root: int, excluded: Any, skip: Any, tree_root: int) -> list[int]:
    """Descendants of `root` top-down, leaving out (and reporting) excluded processes and their subtrees."""
    out: list[int] = []
    frontier = [root]
    while frontier:
        nxt: list[int] = []
        for parent in frontier:
            for child in table.children(parent):
                p = table.procs[child]
                if p.zombie:
                    continue
                why_not = excluded(p)
                if why_not is not None:
                    code, text = why_not
                    skip(p, code, f"in the job tree of {tree_root} but is {text}: left running with its subtree")
                    continue
                out.append(child)
                nxt.append(child)
        frontier = nxt
    return out


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


def nvml_processes(backend: GpuBackend, indices: Iterable[int]) -> dict[int, tuple[GpuProcess, ...]]:
    """NVML's process lists; a GPU whose list cannot be read contributes none (it is reported elsewhere)."""
    out: dict[int, tuple[GpuProcess, ...]] = {}
    for i in indices:
        try:
            out[i] = tuple(backend.processes(i))
        except Exception:
            out[i] = ()
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
    table: ProcessTable | None = None,
) -> CleanupPlan:
    """Find who holds the selected GPUs and plan what to stop; stops nothing.

    `dev_dir` defaults to `$PODGUARD_DEV_DIR` or `/dev`; `self_pid` to this process (a caller acting
    for another process passes that one); `uid` to the effective uid. `snapshots` (from the preflight's
    inventory) or `minors` avoid asking NVML again for minor numbers. Raises `UsageError` for a GPU
    index NVML does not have or an invalid pattern.
    """
    t0 = time.perf_counter()
    count = backend.device_count()
    gpus = tuple(dict.fromkeys(int(g) for g in gpu_indices))
    for g in gpus:
        if not 0 <= g < count:
            valid = f"0-{count - 1}" if count else "none: no GPU"
            raise UsageError(f"GPU index {g} is out of range (valid: {valid})")
    mins = dict(minors) if minors is not None else minor_numbers(backend, snapshots)
    config = PlanConfig(
        gpus=gpus,
        dev_dir=str(resolve_dev_dir(dev_dir)),
        protect=tuple(protect),
        patterns=tuple(patterns),
        self_pid=os.getpid() if self_pid is None else int(self_pid),
        uid=os.geteuid() if uid is None else int(uid),
        all_gpus=all_gpus,
        minors=mins,
    )
    return replan(config, backend, table=table, t_start=t0)


def replan(
    config: PlanConfig, backend: GpuBackend, *, table: ProcessTable | None = None, t_start: float | None = None
) -> CleanupPlan:
    """Scan again and plan with the same configuration (used between kill rounds to catch respawns)."""
    t0 = time.perf_counter() if t_start is None else t_start
    nvml = nvml_processes(backend, sorted(config.minors) or range(backend.device_count()))
    if table is None:
        table = scan_processes(Path(config.dev_dir))
    return build_plan(table, nvml, config, t_start=t0)


def describe_holders(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    dev_dir: str | os.PathLike[str] | None = None,
    protect: Sequence[str] = (),
) -> dict[str, Any]:
    """Read-only view for `podguard doctor`: who holds each GPU, by the same evidence rules as cleanup.

    Returns `{"gpus": {"0": ["pid 123 python train.py (fd+NVML, 10.0 GiB)", ...]}, "foreign": [str],
    "foreign_detail": [dict], "monitors": [pid], "uninspectable": [pid], "plan": CleanupPlan.to_dict()}`.
    """
    indices = tuple(gpu_indices)
    plan = plan_cleanup(backend, indices, dev_dir=dev_dir, protect=protect, all_gpus=True)
    notes = {s.pid: s.code for s in plan.skipped}
    per_gpu: dict[str, list[str]] = {str(i): [] for i in indices}
    for h in plan.holders:
        how = {Evidence.BOTH: "fd+NVML", Evidence.FD: "fd only", Evidence.NVML: "NVML only, fds unreadable"}
        note = f" [{notes[h.pid]}]" if h.pid in notes else ""
        for g in h.gpus:
            if str(g) in per_gpu:
                mem = h.memory.get(g)
                mem_text = f", {describe_memory(mem)}" if mem is not None else ""
                per_gpu[str(g)].append(f"pid {h.pid} {_short(h.cmdline, 80)} ({how[h.evidence]}{mem_text}){note}")
    return {
        "gpus": per_gpu,
        "foreign": [f"pid {f.pid} on GPU{f.gpu} ({describe_memory(f.used_memory)}): {f.reason}" for f in plan.foreign],
        "foreign_detail": [f.to_dict() for f in plan.foreign],
        "monitors": list(plan.monitors),
        "uninspectable": list(plan.uninspectable),
        "plan": plan.to_dict(),
    }

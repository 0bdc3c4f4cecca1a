"""Which processes are the job's ranks: the ones whose Python stacks a hang needs.

    targets = find_rank_processes({"torchrun": agent_pid}, gpus={"torchrun": (0, 1)})

Each worker itself (single, per-gpu modes) and, under torchrun, its rank processes (RANK/LOCAL_RANK from
/proc/<pid>/environ), never torchrun's agent nor podguard's rank wrapper. Ranks a job starts itself are found
too: torch.multiprocessing.spawn's children (no RANK: labelled by the order they started), Lightning's (LOCAL_RANK
1..n-1: the launching process is local rank 0), `accelerate launch`'s (torchrun's, in process). A rank's own
children (data-loader workers) and multiprocessing helpers are kept with their roles (`StackTarget.role`):
their stacks are taken, the summary does not compare them."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from podguard.procfs import PROC, children_of, read_stat

__all__ = ["WRAP_MODULE", "StackTarget", "find_rank_processes"]

WRAP_MODULE = "podguard.rank.wrap"  # torchrun mode's per-rank wrapper: an ancestor of the rank, not the rank
_PYTHON_EXE = re.compile(r"^(python|pypy)[0-9.]*[dmu]*$")
DATA_WORKER = "pt_data_worker"  # the name torch gives a DataLoader worker's thread (torch/utils/data/_utils/worker.py)
_HELPER = re.compile(  # multiprocessing's own helpers and torch.compile's worker pool: never ranks
    r"multiprocessing\.(resource_tracker|forkserver|semaphore_tracker)|torch\._inductor\.compile_worker"
)


@dataclass(frozen=True)
class StackTarget:
    """One process whose stacks to take."""

    pid: int
    rank: int | None  # global RANK where known
    local_rank: int | None
    gpu: int | None  # NVML index the rank uses, where known
    name: str  # the supervisor's worker name, e.g. "GPU3" or "torchrun"
    role: str = "rank"  # "rank" | "launcher" (mp.spawn's parent, an agent) | "helper" (resource_tracker ...)
    # | "child" (a rank's own process: data-loader workers); only ranks are compared in the summary

    @property
    def label(self) -> str:
        """'rank 3 (GPU 3)', 'rank 0', or the worker name when there is no rank."""
        who = f"rank {self.rank}" if self.rank is not None else self.name
        return f"{who} (GPU {self.gpu})" if self.gpu is not None else who


def _environ(pid: int) -> dict[str, str]:
    """The process's initial environment (Yama restricts attaching, not this read); {} when unreadable."""
    try:
        raw = Path(f"{PROC}/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"{PROC}/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (its executable's name)."""
    try:
        exe = os.path.basename(os.readlink(f"{PROC}/{pid}/exe"))
    except OSError:
        argv = _cmdline(pid)
        exe = os.path.basename(argv[0]) if argv else ""
    return bool(_PYTHON_EXE.match(exe.removesuffix(" (deleted)")))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class _Proc:
    pid: int
    rank: int | None  # RANK, else LOCAL_RANK (Lightning's children have only LOCAL_RANK)
    local_rank: int | None
    python: bool
    wrapper_gpus: tuple[int, ...] | None  # podguard's rank wrapper, with the NVML indices it was given
    helper: bool  # a multiprocessing helper (resource_tracker, forkserver): never a rank
    start: int  # start time (clock ticks since boot): child order
    data_worker: bool = False  # torch's DataLoader worker (its thread is named pt_data_worker): never a rank


def _describe(pid: int) -> _Proc:
    env = _environ(pid)
    argv = _cmdline(pid)
    wrapper = any(a == f"-m{WRAP_MODULE}" or a == WRAP_MODULE for a in argv)
    gpus: tuple[int, ...] | None = None
    if wrapper:
        spec = next((a.removeprefix("--gpus=") for a in argv if a.startswith("--gpus=")), "")
        gpus = tuple(i for i in (_int(g) for g in spec.split(",")) if i is not None)
    local = _int(env.get("LOCAL_RANK"))
    rank = _int(env.get("RANK"))
    helper = any(_HELPER.search(a) for a in argv)
    stat = read_stat(pid)
    start = stat.start_time if stat is not None else 0
    loader = stat is not None and stat.comm == DATA_WORKER
    return _Proc(pid, rank if rank is not None else local, local, _is_python(pid), gpus, helper, start, loader)


def _rank_gpu(gpus: Sequence[int], local_rank: int | None) -> int | None:
    if len(gpus) == 1:
        return gpus[0]
    if local_rank is not None and 0 <= local_rank < len(gpus):
        return gpus[local_rank]
    return None


class _Walk:
    """One worker's tree, read once from /proc, and the targets found in it (see `_walk`)."""

    def __init__(self, root: int, name: str, gpus: Sequence[int]) -> None:
        self.name = name
        self.found: list[StackTarget] = []
        self.procs: dict[int, _Proc] = {}
        self.kids: dict[int, list[int]] = {}
        todo = [root]
        while todo and len(self.procs) < MAX_TREE:
            pid = todo.pop()
            if pid in self.procs:
                continue
            self.procs[pid] = _describe(pid)
            self.kids[pid] = sorted(children_of(pid), key=lambda c: c)
            todo.extend(self.kids[pid])
        self.visit(root, _UNSEEN, tuple(gpus), inside=False)

    def add(self, proc: _Proc, rank: int | None, local: int | None, gpus: Sequence[int], role: str) -> None:
        self.found.append(StackTarget(proc.pid, rank, local, _rank_gpu(gpus, local), self.name, role))

    def python_kids(self, pid: int) -> list[_Proc]:
        """The Python children that may be ranks (not helpers), in the order they started."""
        kids = [self.procs[c] for c in self.kids.get(pid, []) if c in self.procs]
        return sorted(
            (k for k in kids if k.python and not k.helper and not k.data_worker), key=lambda k: (k.start, k.pid)
        )

    def visit(self, pid: int, claimed: object, gpus: tuple[int, ...], inside: bool) -> None:
        proc = self.procs.get(pid)
        if proc is None:
            return
        if proc.wrapper_gpus:
            gpus = proc.wrapper_gpus
        if proc.python and proc.helper:
            self.add(proc, None, None, (), "helper")
        elif proc.python and proc.data_worker:  # a DataLoader worker: its rank's (or the job's) own child
            if sum(1 for t in self.found if t.role == "child") < MAX_CHILDREN:
                self.add(proc, None, None, (), "child")
            return
        elif proc.python and proc.wrapper_gpus is None:
            if inside and proc.rank is not None and proc.rank != claimed:  # a rank below a rank's launcher
                self.add(proc, proc.rank, proc.local_rank, gpus, "rank")
                claimed = proc.rank
            elif inside:  # a data-loader or compile worker of the rank above (it inherits its RANK)
                if sum(1 for t in self.found if t.role == "child") < MAX_CHILDREN:
                    self.add(proc, None, None, (), "child")
            elif proc.rank is not None:
                self.add(proc, proc.rank, proc.local_rank, gpus, "rank")
                claimed, inside = proc.rank, True
            else:
                self.launcher(proc, gpus)
                return
        for child in self.kids.get(pid, []):
            self.visit(child, claimed, gpus, inside)

    def launcher(self, proc: _Proc, gpus: tuple[int, ...]) -> None:
        """A Python process without a rank above the ranks: torchrun's agent, `accelerate launch`, mp.spawn's
        parent (its children have no RANK: they are ranks in the order they started), Lightning's rank 0 (its
        children have LOCAL_RANK 1..n-1), or the job itself (no Python children)."""
        kids = self.python_kids(proc.pid)
        if kids and all(k.rank is None for k in kids):  # mp.spawn: rank i is the i-th child started
            spawned = {k.pid: order for order, k in enumerate(kids)}
            for child in self.kids.get(proc.pid, []):
                if child in spawned:
                    self.add(self.procs[child], spawned[child], spawned[child], gpus, "rank")
                    for grandchild in self.kids.get(child, []):
                        self.visit(grandchild, spawned[child], gpus, inside=True)
                else:
                    self.visit(child, _UNSEEN, gpus, inside=False)
            return
        before = len(self.found)
        for child in self.kids.get(proc.pid, []):
            self.visit(child, _UNSEEN, gpus, inside=False)
        below = {t.local_rank for t in self.found[before:] if t.role == "rank"}
        if below and 0 not in below and 1 in below:
            self.add(proc, 0, 0, gpus, "rank")  # Lightning: the launching process is local rank 0 itself
        elif not below:
            self.add(proc, None, None, gpus, "launcher")


_UNSEEN = object()
MAX_TREE = 512  # processes read per worker tree, at most
MAX_CHILDREN = 32  # a rank's own Python children dumped (data-loader workers), at most per worker


def _walk(root: int, name: str, gpus: Sequence[int]) -> list[StackTarget]:
    """The topmost Python process of each rank in root's tree, labelled by RANK/LOCAL_RANK where the environment
    has them, else by child order (mp.spawn); podguard's wrapper is never one. Also, with roles that keep them
    out of the summary's comparison: a rank's own Python children (data-loader workers, which inherit its
    RANK) and multiprocessing helpers. A launcher (torchrun's agent) only when nothing below it is a rank."""
    walk = _Walk(root, name, gpus)
    ranks = [t for t in walk.found if t.role == "rank"]
    if ranks:
        return [t for t in walk.found if t.role != "launcher"]
    launchers = [t for t in walk.found if t.role == "launcher"]
    if launchers:
        return [replace(t, role="rank") if t.role == "launcher" else t for t in walk.found]  # the job itself
    return [StackTarget(root, None, None, gpus[0] if len(gpus) == 1 else None, name)]


def find_rank_processes(
    worker_pids: Mapping[str, int], *, gpus: Mapping[str, Sequence[int]] | None = None
) -> list[StackTarget]:
    """The processes to dump, ranks first in rank order: each worker itself (single, per-gpu) and, under
    torchrun, its rank processes (RANK/LOCAL_RANK from /proc/<pid>/environ; the agent is not a rank).

    `gpus`: worker name -> the NVML indices it sees (WorkerSpec.gpus); a rank uses the one at its LOCAL_RANK.
    Under podguard's torchrun wrapper the indices come from the wrapper's `--gpus` too.
    """
    targets: list[StackTarget] = []
    for name, pid in worker_pids.items():
        if read_stat(pid) is None:
            continue
        targets.extend(_walk(pid, name, tuple((gpus or {}).get(name, ()))))
    order = {"rank": 0, "launcher": 1, "child": 2, "helper": 3}
    return sorted(targets, key=lambda t: (order.get(t.role, 4), t.rank is None, t.rank or 0, t.pid))

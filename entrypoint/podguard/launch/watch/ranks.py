"""Which processes are the job's ranks: the ones whose Python stacks a hang needs.

    targets = find_rank_processes({"torchrun": agent_pid}, gpus={"torchrun": (0, 1)})

Each worker itself (single, per-gpu modes) and, under torchrun, its rank processes (RANK/LOCAL_RANK from
/proc/<pid>/environ), never torchrun's agent nor podguard's rank wrapper nor a rank's own children.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from podguard.procfs import PROC, children_of, read_stat

__all__ = ["WRAP_MODULE", "StackTarget", "find_rank_processes"]

WRAP_MODULE = "podguard.rank.wrap"  # torchrun mode's per-rank wrapper: an ancestor of the rank, not the rank
_PYTHON_EXE = re.compile(r"^(python|pypy)[0-9.]*[dmu]*$")


@dataclass(frozen=True)
class StackTarget:
    """One process whose stacks to take."""

    pid: int
    rank: int | None  # global RANK where known
    local_rank: int | None
    gpu: int | None  # NVML index the rank uses, where known
    name: str  # the supervisor's worker name, e.g. "GPU3" or "torchrun"

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
    rank: int | None
    local_rank: int | None
    python: bool
    wrapper_gpus: tuple[int, ...] | None  # podguard's rank wrapper, with the NVML indices it was given


def _describe(pid: int) -> _Proc:
    env = _environ(pid)
    argv = _cmdline(pid)
    wrapper = any(a == f"-m{WRAP_MODULE}" or a == WRAP_MODULE for a in argv)
    gpus: tuple[int, ...] | None = None
    if wrapper:
        spec = next((a.removeprefix("--gpus=") for a in argv if a.startswith("--gpus=")), "")
        gpus = tuple(i for i in (_int(g) for g in spec.split(",")) if i is not None)
    return _Proc(pid, _int(env.get("RANK")), _int(env.get("LOCAL_RANK")), _is_python(pid), gpus)


def _rank_gpu(gpus: Sequence[int], local_rank: int | None) -> int | None:
    if len(gpus) == 1:
        return gpus[0]
    if local_rank is not None and 0 <= local_rank < len(gpus):
        return gpus[local_rank]
    return None


def _walk(root: int, name: str, gpus: Sequence[int]) -> list[StackTarget]:
    """The topmost Python process of each RANK in root's tree (not podguard's wrapper, not a rank's own
    children such as data-loader workers, which inherit its RANK); the agent only when nothing has a rank."""
    found: list[StackTarget] = []
    agents: list[StackTarget] = []
    stack: list[tuple[int, object, tuple[int, ...]]] = [(root, _UNSEEN, tuple(gpus))]
    while stack:
        pid, claimed, seen_gpus = stack.pop()
        proc = _describe(pid)
        if proc.wrapper_gpus:
            seen_gpus = proc.wrapper_gpus
        if proc.python and proc.wrapper_gpus is None and claimed != proc.rank:
            target = StackTarget(pid, proc.rank, proc.local_rank, _rank_gpu(seen_gpus, proc.local_rank), name)
            (found if proc.rank is not None else agents).append(target)
            claimed = proc.rank
        stack.extend((child, claimed, seen_gpus) for child in children_of(pid))
    return found or agents or [StackTarget(root, None, None, gpus[0] if len(gpus) == 1 else None, name)]


_UNSEEN = object()


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
    return sorted(targets, key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.pid))

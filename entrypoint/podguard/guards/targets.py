"""Which processes get the save signal: the training processes, found through the launchers and shells above them.

    pids = save_targets(worker_pid, signal.SIGUSR1)   # the worker itself, or (a launcher, a shell) what it runs

A launcher or a shell dies of SIGUSR1 (its default action) and takes no save: `bash train.sh`, `accelerate
launch`, a user's own `torchrun`, podguard's torchrun agent and its rank wrappers all pass the signal down to
their children instead. Below a launcher, stream helpers (`| tee log`) are left alone: SIGUSR1 would kill them and
the job would die of the broken pipe. A process that is neither (the `python train.py` itself) gets the signal,
and nothing below it does: its data loader workers die of SIGUSR1 too (forked, they also inherit its handler).
One exception: a process that does not catch the signal (`SigCgt` in /proc/<pid>/status) while Python children of
its own do is a launcher too — `torch.multiprocessing.spawn`'s parent, whose ranks (the training processes) have the
handler while it waits in `ProcessContext.join` and would die of the signal, taking the job with it.
"""

from __future__ import annotations

import os
import re

from podguard.procfs import children_of, read_bytes

__all__ = ["catches", "is_launcher", "save_targets"]

MAX_DEPTH = 4  # shell -> launcher -> rank wrapper -> rank
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_LAUNCHERS = {
    *("sh", "bash", "dash", "zsh", "ksh", "env", "nohup", "timeout", "time", "stdbuf", "setsid", "taskset"),
    *("torchrun", "accelerate", "deepspeed", "uv", "conda", "mamba", "micromamba", "poetry", "pixi"),
}
_LAUNCHER_MODULES = {
    *("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch"),
    *("accelerate.commands.accelerate_cli", "deepspeed.launcher.runner", "deepspeed.launcher.launch"),
    "podguard.rank.wrap",
}
_STREAM_HELPERS = {"tee", "cat", "grep", "sed", "awk", "ts", "logger", "head", "tail", "sleep", "multilog"}


def _cmdline(pid: int) -> list[str]:
    try:
        raw = read_bytes(f"/proc/{pid}/cmdline", 1 << 16)
    except OSError:  # it just ended
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_launcher(argv: list[str]) -> bool:
    """A shell, a launcher, or Python running a launcher module or script (`python -m torch.distributed.run`,
    `python /usr/bin/torchrun`, `python -m podguard.rank.wrap`)."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    if name in _LAUNCHERS:
        return True
    if not _PYTHON.match(name):
        return False
    rest = argv[1:]
    while rest and rest[0].startswith("-") and not rest[0].startswith("-m"):  # -u, -X dev, -W ignore
        rest = rest[2:] if rest[0] in ("-X", "-W") else rest[1:]
    if rest and rest[0].startswith("-m"):  # `-m module` or `-mmodule` (podguard's torchrun command)
        module = rest[0][2:] or (rest[1] if len(rest) > 1 else "")
        return module in _LAUNCHER_MODULES
    return bool(rest) and os.path.basename(rest[0]) in _LAUNCHERS


def catches(pid: int, signum: int) -> bool | None:
    """Whether the process has a handler for `signum` (its `SigCgt` mask); None when unreadable (gone)."""
    try:
        status = read_bytes(f"/proc/{pid}/status", 1 << 16)
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(b"SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return None


def save_targets(pid: int, signum: int | None = None, depth: int = 0) -> list[int]:
    """The processes that should get the save signal `signum` for the worker process `pid` (without `signum`,
    the handlers are not looked at)."""
    if depth >= MAX_DEPTH:
        return [pid]
    if not is_launcher(_cmdline(pid)):
        if signum is None or catches(pid, signum) is not False:
            return [pid]
        ranks = [c for c in children_of(pid) if _runs_python(c) and catches(c, signum)]  # mp.spawn's ranks
        return ranks or [pid]
    out: list[int] = []
    for child in children_of(pid):
        argv = _cmdline(child)
        if not argv or os.path.basename(argv[0]) in _STREAM_HELPERS:  # (no argv: it has just ended)
            continue
        out.extend(save_targets(child, signum, depth + 1))
    return out


def _runs_python(pid: int) -> bool:
    argv = _cmdline(pid)
    return bool(argv) and bool(_PYTHON.match(os.path.basename(argv[0])))

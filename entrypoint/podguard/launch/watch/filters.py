"""Filters in the job's own pipeline that hold its lines (`python train.py | mawk '{print strftime(), $0}'`): the
bytes they read are the job's activity while nothing reaches podguard.

    filters = PipelineFilters()
    for worker, note in filters.sample({"job": (pid, pipe_inode)}):   # while the job has been quiet a while
        progress.activity(worker, now); say(note) if note else None

A filter is a process of a worker's tree whose stdout is that worker's pipe to podguard and whose stdin is a pipe
(the last stage of a pipeline). Its read counter (`rchar` of /proc/<pid>/io: bytes it read from its input) grows
when the stages before it print, and stands still when they are stuck: a deadlocked job gives no such sign. A
filter that podguard cannot make line by line (mawk reads and prints in blocks, whatever its output: only
`mawk -W interactive` does not) is named once, the first time its input counts. perl and C++'s own buffers are
made line by line instead (launch/line_shims.py), sed and other C stdio filters by stdbuf. docs/watch.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from podguard.procfs import children_of, read_comm

if TYPE_CHECKING:
    from podguard.launch.supervisor import Supervisor

__all__ = ["PipelineFilters", "read_count"]

MAX_PROCS = 64  # processes looked at per worker tree
_ADVICE = {"mawk": " (`mawk -W interactive` prints line by line)", "awk": " (mawk: `-W interactive`)"}


def read_count(pid: int) -> int | None:
    """Bytes the process has read (`rchar` of /proc/<pid>/io); None when unreadable or gone."""
    try:
        with open(f"/proc/{pid}/io", "rb") as fh:
            for line in fh.read().splitlines():
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _fd_target(pid: int, fd: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


class PipelineFilters:
    """See the module docstring."""

    def __init__(self) -> None:
        self._reads: dict[int, int] = {}  # filter pid -> bytes read when last sampled
        self._named: set[int] = set()  # filters already named

    def sample(self, workers: Mapping[str, tuple[int, int]]) -> list[tuple[str, str]]:
        """(worker, note) for each worker whose filters read since the last sample; the note names a filter the
        first time (else ''). `workers`: name -> (pid, the inode of its pipe to podguard)."""
        moved: list[tuple[str, str]] = []
        alive: set[int] = set()
        for name, (root, inode) in workers.items():
            notes = []
            grew = False
            for pid in self._filters(root, inode):
                alive.add(pid)
                count = read_count(pid)
                if count is None:
                    continue
                before = self._reads.get(pid)
                self._reads[pid] = count
                if before is None or count <= before:
                    continue
                grew = True
                if pid not in self._named:
                    self._named.add(pid)
                    comm = read_comm(pid)
                    notes.append(
                        f"note: {comm} (pid {pid}) in the job's pipeline holds its output in blocks; the bytes it "
                        f"reads count as the job's activity{_ADVICE.get(comm, '')}"
                    )
            if grew:
                moved.append((name, "; ".join(notes)))
        self._reads = {pid: count for pid, count in self._reads.items() if pid in alive}
        return moved

    def sample_supervisor(self, sup: Supervisor) -> list[tuple[str, str]]:
        """`sample` over the supervisor's live workers whose pipe is still open."""
        pipes: dict[str, tuple[int, int]] = {}
        for name, worker in sup.workers.items():
            stream = sup.printer.streams.get(name)
            if worker.alive and stream is not None and stream.fd is not None and not stream.eof:
                try:
                    pipes[name] = (worker.pid, os.fstat(stream.fd).st_ino)
                except OSError:
                    continue
        return self.sample(pipes)

    def _filters(self, root: int, inode: int) -> list[int]:
        pipe = f"pipe:[{inode}]"
        found, todo, seen = [], [root], 0
        while todo and seen < MAX_PROCS:
            pid = todo.pop()
            seen += 1
            todo.extend(children_of(pid))
            if _fd_target(pid, 1) == pipe and (source := _fd_target(pid, 0)).startswith("pipe:") and source != pipe:
                found.append(pid)
        return found

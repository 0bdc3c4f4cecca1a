"""Is a quiet rank hung, or waiting for the others? The per-rank rule's looks beyond the heartbeats, for the
run-time watch (runtime.py), on the supervisor's loop.

    quiet = QuietRanks(timeout_s=1800, pattern=None, line_rank=re.compile(r"^rank(?P<rank>\\d+):"))
    rank = quiet.line_rank(sup, "torchrun", "rank3:saving 12/35")     # whose line: a prefix, or a one-rank worker
    quiet.sample(progress, now)                                       # a quiet rank's process wrote: its progress
    quiet.judge(hang, progress, now, on_loop=..., hung=..., still=...)  # a rank's own progress stopped: look

A rank's own progress is its heartbeats, its busy announcements, the lines known to be its own (torchrun's
`rank3:` prefix; a per-gpu worker is one rank) and, where any output counts (no --progress), a write of its process
(`wchar` in /proc/<pid>/io grew: a rank printing in a shared pipe, mp.spawn's, or saving a file). When it stops for
--hang-timeout while the job moves on, its stacks are looked at (probe.py) before it is called hung: a rank that
waits in a collective, a barrier or a rendezvous waits for the others and is not hung (said once, naming it and
the progress the job made); any other place, a stopped rank, or stacks that cannot be taken: hung. docs/watch.md,
"A rank that waits is not hung".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from podguard import console
from podguard.durations import format_duration
from podguard.launch.watch.hangs import Hang, ProgressWatch
from podguard.launch.watch.probe import RankProbe, waits
from podguard.launch.watch.stacks import StackTarget
from podguard.launch.watch.verdict import group_ranks

if TYPE_CHECKING:
    from podguard.launch.supervisor import Supervisor
    from podguard.launch.watch.stack_model import RankStacks

__all__ = ["QuietRanks", "write_count"]

PROBE_GIVE_UP_S = 12.0  # a probe still running after this (py-spy's 5 s, its kill, slack): judge without it


def write_count(pid: int) -> int | None:
    """Bytes the process has written (`wchar` of /proc/<pid>/io: write(2) and friends, to any file or pipe)."""
    try:
        with open(f"/proc/{pid}/io", "rb") as fh:
            for line in fh.read().splitlines():
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class QuietRanks:
    """See the module docstring."""

    def __init__(
        self,
        timeout_s: float | None,
        pattern: re.Pattern[str] | None,
        line_rank: re.Pattern[str] | None = None,
        slot_gpus: dict[int, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self.pattern = pattern
        self._line_rank = line_rank
        self._slot_gpus = slot_gpus or {}
        self._worker_rank: dict[str, int | None] = {}
        self._writes: dict[int, tuple[int, int]] = {}  # slot -> (pid, bytes written when last sampled)
        self._probe: RankProbe | None = None
        self._suspect: Hang | None = None
        self._told: set[tuple[int | None, int]] = set()  # (slot, pid) already said to wait

    # -- whose line ---------------------------------------------------------------------------------------
    def line_rank(self, sup: Supervisor | None, worker: str, line: str) -> int | None:
        """The rank a line is known to come from: the launcher's prefix, else a worker that is one rank."""
        if self._line_rank is not None and (m := self._line_rank.match(line)) is not None:
            return int(m.group("rank"))
        if worker not in self._worker_rank:
            spec = sup.workers[worker].spec if sup is not None and worker in sup.workers else None
            raw = (spec.env.get("RANK") or "") if spec is not None else ""
            self._worker_rank[worker] = int(raw) if raw.isdigit() and self._line_rank is None else None
        return self._worker_rank[worker]

    # -- the write counters of quiet ranks ------------------------------------------------------------------
    def sample(self, progress: ProgressWatch, now: float) -> None:
        """A rank quiet for half the timeout whose process wrote since the last look made progress (only where any
        output counts: no --progress)."""
        if self.timeout_s is None or self.pattern is not None:
            return
        for slot, (_, _, pid) in list(progress.rank_last.items()):
            if now - progress.rank_at(slot) < self.timeout_s / 2 or pid <= 0:
                self._writes.pop(slot, None)
                continue
            count = write_count(pid)
            if count is None:
                continue
            before = self._writes.get(slot)
            self._writes[slot] = (pid, count)
            if before is not None and before[0] == pid and count > before[1]:
                progress.rank_wrote(slot, now)

    # -- a quiet rank: look where it waits ------------------------------------------------------------------
    def judge(
        self,
        hang: Hang,
        progress: ProgressWatch,
        now: float,
        *,
        on_loop: Callable[[Callable[[], None]], None],
        hung: Callable[[Hang], None],
        still: Callable[[], Hang | None],
    ) -> None:
        """`hang`: ranks whose own progress stopped while the job moves on. Their stacks are taken off the loop;
        back on it (`on_loop`), those that wait are excused (said once), and if a rank is still hung (`still()`),
        `hung(...)` is called. A probe that does not come back in time: `hung(hang)`."""
        if self._probe is None:
            self._probe = RankProbe(lambda results: on_loop(lambda: self._probed(results, progress, hung, still)))
        if self._probe.running:
            if self._probe.running_for(now) >= PROBE_GIVE_UP_S and self._suspect is not None:
                self._suspect, suspect = None, self._suspect
                hung(suspect)
            return
        targets = {}
        for slot in hang.slots:
            pid = progress.rank_last[slot][2] if slot in progress.rank_last else 0
            if pid > 0:
                label = progress.labels.get(slot, slot)
                targets[slot] = StackTarget(pid, label, slot, self._slot_gpus.get(slot), f"rank {label}")
        self._suspect = hang  # (before the start: its answer may come back at once)
        if not targets or not self._probe.start(targets):
            self._suspect = None
            hung(hang)

    def _probed(
        self,
        results: dict[int, RankStacks],
        progress: ProgressWatch,
        hung: Callable[[Hang], None],
        still: Callable[[], Hang | None],
    ) -> None:
        suspect, self._suspect = self._suspect, None
        if suspect is None:
            return  # given up on meanwhile (hung() was called)
        now = self._clock()
        waiting = [results[s] for s in suspect.slots if waits(results.get(s))]
        for stacks in waiting:
            slot = stacks.target.local_rank if stacks.target.local_rank is not None else -1
            progress.excuse(slot, now, f"waits in {stacks.collective}")
        fresh = [s for s in waiting if (s.target.local_rank, s.target.pid) not in self._told]
        if fresh:
            self._told.update((s.target.local_rank, s.target.pid) for s in fresh)
            console.say(self._waiting_line(fresh, progress, {s.target.local_rank for s in waiting}, now))
        left = still()
        if left is not None and (left.job or set(left.slots) <= set(suspect.slots)):
            hung(left)  # (a rank that went quiet meanwhile is looked at first, at the next tick)

    def _waiting_line(
        self, waiting: list[RankStacks], progress: ProgressWatch, quiet: set[int | None], now: float
    ) -> str:
        """'rank 1 waits in barrier at job.py:20 in main; rank 0 made progress 1s ago: waiting, not hung'."""
        others = [s for s in progress.rank_last if s not in quiet]
        best = max(others, key=progress.rank_at, default=None)
        if best is not None and self.timeout_s is not None and now - progress.rank_at(best) < self.timeout_s:
            ago = format_duration(now - progress.rank_at(best))
            moved = f"rank {progress.labels.get(best, best)} made progress {ago} ago"
        else:
            moved = f"the job made progress {format_duration(now - progress.last_at)} ago ({progress.last_what})"
        where = "; ".join(
            f"{group_ranks([s.target.rank for s in group])} {'wait' if len(group) > 1 else 'waits'} in "
            f"{group[0].collective} at {group[0].innermost_user_frame or 'no frame of the user code'}"
            for group in _by_place(waiting)
        )
        return f"{where}; {moved}: waiting for the others, not hung"


def _by_place(stacks: list[RankStacks]) -> list[list[RankStacks]]:
    groups: dict[tuple[str | None, str | None], list[RankStacks]] = {}
    for s in stacks:
        groups.setdefault((s.collective, s.innermost_user_frame), []).append(s)
    return list(groups.values())

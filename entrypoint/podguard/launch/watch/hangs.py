"""Progress and hangs: when did the job (and each rank that sends heartbeats) last move forward?

    watch = ProgressWatch(timeout_s=1800, pattern=re.compile(r"step \\d+"), started_at=time.monotonic())
    watch.line("GPU0", "step 41 loss 2.3", now, rank=0)   # an output line of a worker (podguard's own never come here)
    watch.beats(beats, now); watch.busy(busy, now)       # the heartbeat board (podguard.rank.heartbeat, .busy)
    watch.rank_wrote(slot, now)                          # the rank's process wrote (its /proc write counter grew)
    hang = watch.check(now, alive=pid_alive)             # Hang(...) or None; hang.job: nothing moved at all
    watch.excuse(slot, now, why)                         # the rank waits in a collective for the others (runtime.py)
    watch.hold(now, max_s); watch.release(now)           # podguard waits for a save it asked for: the clock stands

Rules (docs/watch.md, "Progress and hangs"): progress is an output line of the job's processes matching `pattern`
(default: any line), a heartbeat, or a rank's announcement that it is busy saving or evaluating (within its bound).
The job is hung when nothing made progress for `timeout_s` (the clock starts at launch: it must cover start-up). A
rank that has sent a heartbeat is hung when its own progress stops for `timeout_s` — its heartbeats, its busy
announcement, its own output (a line a launcher's prefix or its worker attributes to it; without a pattern, any
write of its process) — whatever the other ranks print, unless the caller excused it (its stack waits in a
collective while the others progress; excused until the timeout passes again or it beats); a rank whose process
has ended (it finished its share: independent workers) is no longer judged. Ranks are named by their global rank
where the heartbeat knew it. `strip` removes a launcher's line prefix (torchrun mode's `rank3: `) before `pattern`
sees the line, so `^step` works in every mode. While the clock is held (podguard waits for a save it asked for, at
most `max_s`) nothing is judged, and the silence before the hold counts on after it. Pure: the caller passes the
time and says which processes are alive.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from podguard.durations import format_duration
from podguard.rank.progress import Beat, Busy

__all__ = ["Hang", "ProgressWatch"]

LINE_SHOWN = 80  # characters of the last progress line quoted in the hang message


@dataclass(frozen=True)
class Hang:
    """A hung job (`ranks` empty) or hung ranks (their heartbeat slots)."""

    silent_s: float  # how long nothing (or the ranks' heartbeats) moved
    last: str  # the last progress, for a person: "heartbeat of rank 1 (step 41)", "GPU0: 'step 41 ...'"
    ranks: tuple[int, ...] = ()  # the hung ranks as a person is told them (global ranks where known)
    slots: tuple[int, ...] = ()  # their heartbeat slots (local ranks)
    job: bool = True  # nothing made progress at all (False: these ranks stopped while the job moved on)

    @property
    def text(self) -> str:
        who = f"rank(s) {', '.join(map(str, self.ranks))}: no progress (heartbeat)" if self.ranks else "no progress"
        return f"{who} for {format_duration(self.silent_s)} (last progress: {self.last})"

    def to_dict(self) -> dict[str, object]:
        return {
            "silent_s": round(self.silent_s, 3),
            "last": self.last,
            "ranks": list(self.ranks),
            "local_ranks": list(self.slots),
            "text": self.text,
        }


class ProgressWatch:
    """See the module docstring. `timeout_s` None: progress is only counted (crash-loop rule), never judged."""

    def __init__(
        self,
        timeout_s: float | None,
        pattern: re.Pattern[str] | None,
        started_at: float,
        strip: re.Pattern[str] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.pattern = pattern
        self.strip = strip
        self.started_at = started_at
        self.last_at = started_at
        self.last_what = "none since launch"
        self.rank_last: dict[int, tuple[float, int | None, int]] = {}  # slot -> (time of its newest beat, step, pid)
        self.labels: dict[int, int] = {}  # slot -> the rank a person is told (global where known)
        self._seen: dict[int, tuple[int, int]] = {}  # slot -> (count, pid) of its newest beat read
        self.matched = False  # a --progress line matched (or, without a pattern: nothing to match)
        self.beating = False  # some rank sent a heartbeat
        self.seen = False  # anything counted as progress at all (a line or a heartbeat)
        self.events = 0  # progress counted on this node (what it shares with the other nodes of a cluster)
        self.rank_lines: dict[int, float] = {}  # rank (as labelled) -> its latest own progress line
        self.rank_other: dict[int, float] = {}  # slot -> its latest other sign: busy, a write of its process
        self.busy_now: dict[int, Busy] = {}  # slot -> its announcement while it holds the clock
        self.excused: dict[int, tuple[float, str]] = {}  # slot -> (until, why): it waits for the others
        self.held: tuple[float, float] | None = None  # (since, until): podguard waits for a save it asked for

    @property
    def progressed(self) -> bool:
        """The attempt made measurable progress: a --progress match or a heartbeat (the crash-loop rule)."""
        return self.matched or self.beating

    def line(self, worker: str, line: str, now: float, rank: int | None = None) -> None:
        """An output line of `worker`; `rank`: the rank it is known to come from (a launcher's prefix, a worker
        that is one rank), whose own progress it is too."""
        if self.pattern is not None:
            text = self.strip.sub("", line, count=1) if self.strip is not None else line
            if not self.pattern.search(text):
                return
            self.matched = True
        self.seen = True
        self.events += 1
        self.last_at = now
        if rank is not None:
            self.rank_lines[rank] = now
        shown = line.strip()
        self.last_what = f"{worker}: {shown[:LINE_SHOWN]!r}" + ("..." if len(shown) > LINE_SHOWN else "")

    def rank_wrote(self, slot: int, now: float) -> None:
        """The rank's process wrote (its write counter grew): its own progress, where any output counts (no
        pattern). Not the job's: a job whose every rank only writes files is judged on its lines and beats."""
        if self.pattern is None:
            self.rank_other[slot] = max(self.rank_other.get(slot, 0.0), now)

    def busy(self, busy: Mapping[int, Busy], now: float) -> None:
        """The ranks' busy announcements (podguard.rank.busy): within its bound a busy rank is making progress,
        and so is the job; one that ended made progress when it ended."""
        self.busy_now = {}
        for slot, b in busy.items():
            if b.holds(now):
                self.busy_now[slot] = b
                at, what = now, f"rank {self.labels.get(slot, slot)} busy ({b.what})"
            elif b.ended is not None:
                at, what = min(b.ended, now), f"rank {self.labels.get(slot, slot)} done {b.what}"
            else:  # still busy past its bound: its announcement holds no more
                at = min(b.since + b.max_s, now)
                what = f"rank {self.labels.get(slot, slot)} {b.what} past its {format_duration(b.max_s)} bound"
            if at > self.rank_other.get(slot, 0.0):
                self.rank_other[slot] = at
                self.seen = True
                self.events += 1
                if at > self.last_at:
                    self.last_at, self.last_what = at, what

    def excuse(self, slot: int, now: float, why: str) -> None:
        """The rank waits for the others (its stack is in a collective while the job progresses): not hung until
        the timeout passes again, or sooner judged afresh when it beats."""
        if self.timeout_s is not None:
            self.excused[slot] = (now + self.timeout_s, why)

    def hold(self, now: float, max_s: float) -> None:
        """podguard waits for a save it asked for: the clock stands still, for at most `max_s`."""
        if self.held is None:
            self.held = (now, now + max_s)

    def release(self, now: float) -> None:
        """The wait is over: every clock moves on by the time it stood still."""
        if self.held is None:
            return
        since, until = self.held
        self.held = None
        shift = max(0.0, min(now, until) - since)
        self.last_at += shift
        self.rank_last = {slot: (at + shift, step, pid) for slot, (at, step, pid) in self.rank_last.items()}
        self.rank_lines = {rank: at + shift for rank, at in self.rank_lines.items()}
        self.rank_other = {slot: at + shift for slot, at in self.rank_other.items()}

    def activity(self, worker: str, now: float) -> None:
        """Output without a line end (a dot per step): progress when no `pattern` is given (it matches lines)."""
        if self.pattern is None:
            self.seen = True
            self.events += 1
            self.last_at = now
            self.last_what = f"{worker}: output without a line end"

    def remote(self, at: float, what: str) -> None:
        """Another node of the cluster made progress (seen at `at`, this node's clock): the job is not hung.
        Only the job's clock moves; each rank's heartbeats are still judged on their own."""
        if at > self.last_at:
            self.last_at = at
            self.last_what = what

    def beats(self, board: Mapping[int, Beat], now: float) -> list[int]:
        """Take the newest heartbeats; returns the slots that moved since the last call."""
        moved = []
        for slot, beat in board.items():
            if (beat.count, beat.pid) == self._seen.get(slot):
                continue  # (a rank that torchrun's --max-restarts brought back counts from 1 again: a new pid)
            self._seen[slot] = (beat.count, beat.pid)
            self.excused.pop(slot, None)  # it beats again: judged afresh
            at = min(beat.at, now)  # a beat cannot be in the future (clock read before the write)
            self.rank_last[slot] = (at, beat.step, beat.pid)
            self.labels[slot] = beat.label
            moved.append(slot)
            if at >= self.last_at:
                self.last_at = at
                step = f" (step {beat.step})" if beat.step is not None else ""
                self.last_what = f"heartbeat of rank {beat.label}{step}"
        self.beating = self.beating or bool(moved)
        self.seen = self.seen or bool(moved)
        self.events += len(moved)
        return moved

    def rank_at(self, slot: int) -> float:
        """When the rank last made progress of its own: a heartbeat, its own line, a busy span, a write."""
        at = self.rank_last[slot][0] if slot in self.rank_last else 0.0
        line = self.rank_lines.get(self.labels.get(slot, slot), 0.0) if slot in self.labels else 0.0
        return max(at, line, self.rank_other.get(slot, 0.0))

    def check(self, now: float, alive: Callable[[int], bool] | None = None) -> Hang | None:
        """A Hang when the job, or a rank that sends heartbeats, made no progress for `timeout_s`. `alive(pid)`:
        whether a rank's process still runs (a rank that ended is forgotten, not hung)."""
        if self.timeout_s is None:
            return None
        if self.held is not None:
            if now < self.held[1]:
                return None
            self.release(now)  # its bound passed: the clock runs again
        if self.busy_now:
            self.last_at = max(self.last_at, now)  # a rank saving or evaluating within its bound: the job moves
        silent = now - self.last_at
        if silent >= self.timeout_s:
            slots = self._behind()  # lockstep ranks all stop beating at once: name the one(s) left behind
            ranks = tuple(sorted(self.labels.get(s, s) for s in slots))
            return Hang(silent, self._ago(self.last_what, self.last_at, now), ranks, slots)
        stuck = sorted(
            slot
            for slot in self.rank_last
            if slot not in self.busy_now and now - self.rank_at(slot) >= self.timeout_s and not self._excused(slot, now)
        )
        if alive is not None:
            for slot in [s for s in stuck if not alive(self.rank_last[s][2])]:
                del self.rank_last[slot]  # it finished (or died: the supervisor tells that)
                stuck.remove(slot)
        if stuck:
            oldest = min(self.rank_at(s) for s in stuck)
            at, step, _ = self.rank_last[stuck[0]]
            name = self.labels.get(stuck[0], stuck[0])
            last = f"heartbeat of rank {name}" + (f" (step {step})" if step is not None else "")
            ranks = tuple(sorted(self.labels.get(s, s) for s in stuck))
            return Hang(now - oldest, self._ago(last, at, now), ranks, tuple(stuck), job=False)
        return None

    def _excused(self, slot: int, now: float) -> bool:
        until = self.excused.get(slot, (0.0, ""))[0]
        if now < until:
            return True
        self.excused.pop(slot, None)
        return False

    def _behind(self) -> tuple[int, ...]:
        """The heartbeat slots behind the others (a lower step, else fewer beats); () when none is behind."""
        if len(self.rank_last) < 2:
            return ()
        steps = {slot: step for slot, (_, step, _) in self.rank_last.items()}
        if all(step is not None for step in steps.values()):
            key: dict[int, int] = {slot: step for slot, step in steps.items() if step is not None}
        else:
            key = {slot: self._seen.get(slot, (0, 0))[0] for slot in self.rank_last}
        low = min(key.values())
        if low == max(key.values()):
            return ()
        return tuple(sorted(slot for slot, value in key.items() if value == low))

    def next_due(self, now: float) -> float | None:
        """When `check` can next find a hang (None: never)."""
        if self.timeout_s is None:
            return None
        times = [self.last_at, *(self.rank_at(slot) for slot in self.rank_last)]
        return max(now, min(times) + self.timeout_s)

    def _ago(self, what: str, at: float, now: float) -> str:
        if at <= self.started_at and what.startswith("none"):
            return f"none since launch {format_duration(now - self.started_at)} ago"
        return f"{what}, {format_duration(now - at)} ago"

"""Progress and hangs: when did the job (and each rank that sends heartbeats) last move forward?

    watch = ProgressWatch(timeout_s=1800, pattern=re.compile(r"step \\d+"), started_at=time.monotonic())
    watch.line("GPU0", "step 41 loss 2.3", now)      # an output line of a worker (podguard's own lines never come here)
    watch.beats(read_board(path), now)               # the heartbeat slots (podguard.rank.heartbeat)
    hang = watch.check(now, alive=pid_alive)         # Hang(...) or None

Rules (PRODUCT.md "During the run"): progress is an output line of the job's processes matching `pattern`
(default: any line), or a heartbeat. The job is hung when nothing made progress for `timeout_s` (the clock starts
at launch: it must cover start-up). A rank that has sent a heartbeat is hung when its own heartbeats stop for
`timeout_s`, whatever the other ranks print; a rank whose process has ended (it finished its share: independent
workers) is no longer judged. Ranks are named by their global rank where the heartbeat knew it. `strip` removes a
launcher's line prefix (torchrun mode's `rank3: `) before `pattern` sees the line, so `^step` works in every mode.
Pure: the caller passes the time and says which processes are alive.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from podguard.durations import format_duration
from podguard.rank.progress import Beat

__all__ = ["Hang", "ProgressWatch"]

LINE_SHOWN = 80  # characters of the last progress line quoted in the hang message


@dataclass(frozen=True)
class Hang:
    """A hung job (`ranks` empty) or hung ranks (their heartbeat slots)."""

    silent_s: float  # how long nothing (or the ranks' heartbeats) moved
    last: str  # the last progress, for a person: "heartbeat of rank 1 (step 41)", "GPU0: 'step 41 ...'"
    ranks: tuple[int, ...] = ()  # the hung ranks as a person is told them (global ranks where known)
    slots: tuple[int, ...] = ()  # their heartbeat slots (local ranks)

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

    @property
    def progressed(self) -> bool:
        """The attempt made measurable progress: a --progress match or a heartbeat (the crash-loop rule)."""
        return self.matched or self.beating

    def line(self, worker: str, line: str, now: float) -> None:
        if self.pattern is not None:
            text = self.strip.sub("", line, count=1) if self.strip is not None else line
            if not self.pattern.search(text):
                return
            self.matched = True
        self.seen = True
        self.events += 1
        self.last_at = now
        shown = line.strip()
        self.last_what = f"{worker}: {shown[:LINE_SHOWN]!r}" + ("..." if len(shown) > LINE_SHOWN else "")

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

    def check(self, now: float, alive: Callable[[int], bool] | None = None) -> Hang | None:
        """A Hang when the job, or a rank that sends heartbeats, made no progress for `timeout_s`. `alive(pid)`:
        whether a rank's process still runs (a rank that ended is forgotten, not hung)."""
        if self.timeout_s is None:
            return None
        silent = now - self.last_at
        if silent >= self.timeout_s:
            slots = self._behind()  # lockstep ranks all stop beating at once: name the one(s) left behind
            ranks = tuple(sorted(self.labels.get(s, s) for s in slots))
            return Hang(silent, self._ago(self.last_what, self.last_at, now), ranks, slots)
        stuck = sorted(slot for slot, (at, _, _) in self.rank_last.items() if now - at >= self.timeout_s)
        if alive is not None:
            for slot in [s for s in stuck if not alive(self.rank_last[s][2])]:
                del self.rank_last[slot]  # it finished (or died: the supervisor tells that)
                stuck.remove(slot)
        if stuck:
            oldest = min(self.rank_last[s][0] for s in stuck)
            at, step, _ = self.rank_last[stuck[0]]
            name = self.labels.get(stuck[0], stuck[0])
            last = f"heartbeat of rank {name}" + (f" (step {step})" if step is not None else "")
            ranks = tuple(sorted(self.labels.get(s, s) for s in stuck))
            return Hang(now - oldest, self._ago(last, at, now), ranks, tuple(stuck))
        return None

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
        times = [self.last_at, *(at for at, _, _ in self.rank_last.values())]
        return max(now, min(times) + self.timeout_s)

    def _ago(self, what: str, at: float, now: float) -> str:
        if at <= self.started_at and what.startswith("none"):
            return f"none since launch {format_duration(now - self.started_at)} ago"
        return f"{what}, {format_duration(now - at)} ago"

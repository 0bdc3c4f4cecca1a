"""Stragglers during the run: a rank whose step rate stays below its peers' (from `heartbeat(step)`).

    board = StepRates(ratio=0.8)
    board.observe(slot, step, at)          # each new heartbeat with a step (the supervisor's loop)
    for s in board.check(now): ...         # Straggler(slot, rate, median, ...) when it became slow

A rank's rate is measured over its last 20 steps or 5 minutes, whichever is shorter (docs/watch.md); it is slow
when its rate is below `ratio` x the median of its peers' rates (the other ranks with a rate)
at `PERSIST` consecutive checks: one slow interval (a checkpoint, an eval) is not a straggler. A rank is
warned about each time it becomes slow, and recorded once (`named`: one SlowRank per rank, with how many times
it became slow and its worst episode), so the record stays small however long a rank wobbles. Note: in lockstep
data-parallel training every rank waits for the slowest
at each collective, so their step rates are equal; the rates differ where ranks are not in lockstep
(pipeline stages, independent workers, asynchronous data loaders) — docs/watch.md.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["PERSIST", "WINDOW_S", "WINDOW_STEPS", "SlowRank", "StepRates", "Straggler"]

WINDOW_STEPS = 20
WINDOW_S = 300.0
PERSIST = 3
MIN_STEPS = 3  # a rate needs this many steps in its window


@dataclass(frozen=True)
class Straggler:
    slot: int
    rate: float  # steps per second
    median: float  # the peers' median rate
    ratio: float

    @property
    def text(self) -> str:
        return (
            f"rank {self.slot} is slow: {self.rate:.3g} steps/s, below {self.ratio:g} x its peers' median "
            f"{self.median:.3g} steps/s"
        )

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.slot, "rate": self.rate, "median": self.median, "ratio": self.ratio, "text": self.text}

    @property
    def share(self) -> float:
        """Its rate as a fraction of the peers' median (0.5: half as fast)."""
        return self.rate / self.median if self.median > 0 else 0.0


@dataclass
class SlowRank:
    """One rank's straggler record: how many times it became slow, and its worst episode (lowest share)."""

    slot: int
    count: int
    worst: Straggler

    def to_dict(self) -> dict[str, object]:
        return {**self.worst.to_dict(), "times": self.count, "worst_share": round(self.worst.share, 3)}


class StepRates:
    """Per-rank step history and the straggler rule (see the module docstring). `ratio` 0 turns it off."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self._history: dict[int, deque[tuple[float, int]]] = {}
        self._streak: dict[int, int] = {}
        self.slow: dict[int, Straggler] = {}  # ranks slow now (named once)
        self.named: dict[int, SlowRank] = {}  # each rank ever named slow, once (the run's summary and record)

    def observe(self, slot: int, step: int, at: float) -> None:
        history = self._history.setdefault(slot, deque(maxlen=4 * WINDOW_STEPS))
        if history and step <= history[-1][1]:
            if step < history[-1][1]:
                history.clear()  # the step went back: a restarted loop, a new epoch counter
            else:
                return
        history.append((at, step))

    def rate(self, slot: int, now: float) -> float | None:
        """Steps per second over the last WINDOW_STEPS steps (with sparse samples: back to the nearest one at least
        that far back), or over WINDOW_S seconds where that is shorter; None with fewer than MIN_STEPS in it."""
        history = self._history.get(slot)
        if not history:
            return None
        last_at, last_step = history[-1]
        first_at, first_step = last_at, last_step
        for at, step in reversed(history):
            if now - at > WINDOW_S:
                break
            far = last_step - step >= WINDOW_STEPS
            if far and last_step - first_step >= MIN_STEPS:
                break  # the window already holds enough steps
            first_at, first_step = at, step
            if far:
                break  # sparse samples (one per poll): the nearest one at least WINDOW_STEPS back
        if last_step - first_step < MIN_STEPS or last_at <= first_at:
            return None
        return (last_step - first_step) / (last_at - first_at)

    def check(self, now: float) -> list[Straggler]:
        """The ranks that became slow at this check."""
        if self.ratio <= 0:
            return []
        rates = {slot: r for slot in self._history if (r := self.rate(slot, now)) is not None}
        fresh: list[Straggler] = []
        for slot, rate in rates.items():
            peers = [r for s, r in rates.items() if s != slot]
            median = statistics.median(peers) if peers else None
            if median is None or not rate < self.ratio * median:
                self._streak[slot] = 0
                self.slow.pop(slot, None)
                continue
            self._streak[slot] = self._streak.get(slot, 0) + 1
            if slot in self.slow:  # still slow: its record keeps the worst share of the episode
                self._worse(Straggler(slot, rate, median, self.ratio))
            elif self._streak[slot] >= PERSIST:
                found = Straggler(slot, rate, median, self.ratio)
                self.slow[slot] = found
                self._record(found)
                fresh.append(found)
        return fresh

    def _record(self, found: Straggler) -> None:
        known = self.named.get(found.slot)
        if known is None:
            self.named[found.slot] = SlowRank(found.slot, 1, found)
            return
        known.count += 1
        self._worse(found)

    def _worse(self, found: Straggler) -> None:
        known = self.named[found.slot]
        if found.share < known.worst.share:
            known.worst = found

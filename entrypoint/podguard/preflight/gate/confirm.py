"""One NVML read is not a verdict: a degraded finding counts once a second read shows it again.

    found = confirmed([first_read, last_read], reread, last_read_at=t)   # {index: (Degraded, ...)}

nvml.h says HW slowdown "may be also reported during PState or clock change", and a link state can be read
mid-transition: a bit seen once on a healthy GPU must not fail it (docs/gate.md, "No false verdicts"). A finding
(GPU and code) in both of the last two reads counts; one seen in only one of them is read again `gap_s` after
the last read (past NVML's utilisation sample period, up to 1 s, so a GPU that just ran a probe reads idle
again) and counts when that read shows it too. A healthy node (nothing found) reads nothing more. Pure apart
from the `reread` callback, the clock and the sleep, which tests replace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from podguard.preflight.gate.degraded import Degraded

__all__ = ["CONFIRM_GAP_S", "Findings", "confirmed"]

CONFIRM_GAP_S = 1.0  # NVML's utilisation sample period is 1/6 s to 1 s (nvml.h, nvmlDeviceGetUtilizationRates)

Findings = Mapping[int, Sequence[Degraded]]


def _keys(found: Findings) -> set[tuple[int, str]]:
    return {(index, d.code) for index, items in found.items() for d in items}


def _pick(found: Findings, keys: set[tuple[int, str]]) -> dict[int, tuple[Degraded, ...]]:
    """The records of `found` whose (GPU, code) is in `keys`, in `found`'s order."""
    out = {i: tuple(d for d in items if (i, d.code) in keys) for i, items in found.items()}
    return {i: items for i, items in out.items() if items}


def confirmed(
    reads: Sequence[Findings],
    reread: Callable[[], Findings],
    *,
    last_read_at: float,
    gap_s: float = CONFIRM_GAP_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, tuple[Degraded, ...]]:
    """The findings seen in two reads. `reads`: one or two reads' findings, oldest first (the last one taken at
    `last_read_at`, a `clock()` time); `reread()` takes one more read when a finding was seen only once."""
    if not reads:
        return {}
    last = reads[-1]
    earlier = reads[-2] if len(reads) > 1 else {}
    both = _keys(earlier) & _keys(last)
    out = _pick(last, both)
    once = (_keys(earlier) | _keys(last)) - both
    if not once:
        return out
    wait = last_read_at + gap_s - clock()
    if wait > 0:
        sleep(wait)
    again = reread()
    for index, items in _pick(again, once & _keys(again)).items():
        out[index] = (*out.get(index, ()), *items)
    return {index: out[index] for index in sorted(out)}

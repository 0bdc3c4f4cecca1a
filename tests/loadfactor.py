"""How busy this machine is, so that the tests' deadlines hold on a loaded one (a laptop, a shared CI runner, a pod).

    from loadfactor import scaled
    assert wait_until(done, timeout=scaled(5))     # 5 s on an idle machine, more while other work runs beside it

A deadline only bounds how long a test waits for a condition that should come: the wait ends as soon as the
condition holds, so a generous deadline costs nothing when the test passes, and a failing test fails a little
later. Scale deadlines; never scale what a test checks (a promptness bound that is the point of a test stays as
it is and waits for a quiet machine: `make test-load` shows which ones do not).

`load_factor()`: PODGUARD_TEST_LOAD_FACTOR (a number >= 1) where set; else measured at each call from the run
queue: the 1-minute load average or the tasks runnable right now, whichever is more, per CPU this process may
use; at least 1, at most 8.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "MAX_FACTOR", "load_factor", "scaled"]

ENV = "PODGUARD_TEST_LOAD_FACTOR"
MAX_FACTOR = 8.0


def _cpus() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run_queue() -> float:
    """max(1-minute load average, tasks runnable now other than this one)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            fields = fh.read().split()
        return max(float(fields[0]), float(int(fields[3].split("/")[0]) - 1))
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]


def load_factor() -> float:
    """How much longer than on an idle machine things take now (1.0 .. MAX_FACTOR)."""
    raw = os.environ.get(ENV, "").strip()
    if raw:
        try:
            return max(float(raw), 1.0)
        except ValueError:
            raise ValueError(f"{ENV}={raw!r} is not valid; expected a number >= 1 such as 3") from None
    return min(max(_run_queue() / _cpus(), 1.0), MAX_FACTOR)


def scaled(seconds: float) -> float:
    """`seconds` (a deadline right for an idle machine) stretched by the load factor."""
    return seconds * load_factor()

"""One NVML read is not a verdict (gate/confirm.py): a degraded finding counts once two reads show it."""

from __future__ import annotations

import pytest

from podguard.preflight.gate.confirm import CONFIRM_GAP_S, confirmed
from podguard.preflight.gate.degraded import Degraded

SLOW = Degraded("hw_slowdown", "hardware clock slowdown while idle", {"clock_event_reasons": "0x9"})
PCIE = Degraded("pcie_width", "PCIe link x8 of x16", {"width": 8, "max_width": 16})
PCIE_NOW = Degraded("pcie_width", "PCIe link x4 of x16", {"width": 4, "max_width": 16})


class Clock:
    """A fake monotonic clock that sleeping advances; counts the re-reads it is asked for."""

    def __init__(self, now: float = 100.0) -> None:
        self.now, self.slept, self.rereads = now, [], 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def reader(self, *reads: dict[int, tuple[Degraded, ...]]):
        answers = list(reads)

        def reread() -> dict[int, tuple[Degraded, ...]]:
            self.rereads += 1
            return answers.pop(0)

        return reread


def run(reads, again=None, *, last_read_at: float = 100.0, clock: Clock | None = None):
    clock = clock or Clock()
    result = confirmed(
        reads,
        clock.reader(*([again] if again is not None else [])),
        last_read_at=last_read_at,
        clock=clock,
        sleep=clock.sleep,
    )
    return result, clock


def test_nothing_found_reads_nothing_more_and_waits_for_nothing():
    found, clock = run([{}, {}])
    assert found == {} and clock.rereads == 0 and clock.slept == []
    assert run([])[0] == {}


def test_a_finding_in_both_reads_counts_with_the_latest_numbers_and_no_reread():
    found, clock = run([{0: (PCIE,)}, {0: (PCIE_NOW,)}])
    assert found == {0: (PCIE_NOW,)} and clock.rereads == 0


def test_a_finding_in_one_read_is_read_again_after_the_gap_and_dropped_when_gone():
    found, clock = run([{3: (SLOW,)}], {})
    assert found == {} and clock.rereads == 1 and clock.slept == [CONFIRM_GAP_S]


def test_a_finding_seen_again_in_the_reread_counts():
    found, clock = run([{}, {3: (SLOW,)}], {3: (SLOW,)})
    assert found == {3: (SLOW,)} and clock.rereads == 1


def test_only_the_findings_seen_once_are_confirmed_by_the_reread():
    # GPU 1's link in both reads; GPU 3's slowdown only in the last; the reread shows both, plus a new one on GPU 5
    found, _ = run([{1: (PCIE,)}, {1: (PCIE,), 3: (SLOW,)}], {1: (PCIE,), 3: (SLOW,), 5: (PCIE,)})
    assert found == {1: (PCIE,), 3: (SLOW,)}  # GPU 5's finding is seen once (in the reread): it does not count


def test_findings_are_matched_per_gpu_and_code():
    found, _ = run([{0: (SLOW,)}, {1: (SLOW,)}], {})  # the same code on two different GPUs: once each
    assert found == {}
    found, _ = run([{0: (SLOW,)}, {0: (PCIE,)}], {0: (PCIE,)})  # a different code on one GPU: once each
    assert found == {0: (PCIE,)}


def test_the_gap_counts_from_the_last_read_not_from_now():
    clock = Clock(now=100.4)
    _, clock = run([{0: (SLOW,)}], {}, last_read_at=100.0, clock=clock)
    assert clock.slept == [pytest.approx(CONFIRM_GAP_S - 0.4)]
    clock = Clock(now=105.0)  # the gap has passed already: read at once
    _, clock = run([{0: (SLOW,)}], {0: (SLOW,)}, last_read_at=100.0, clock=clock)
    assert clock.slept == [] and clock.rereads == 1


def test_the_results_are_in_gpu_order():
    found, _ = run([{5: (PCIE,)}, {5: (PCIE,), 2: (SLOW,)}], {2: (SLOW,)})
    assert list(found) == [2, 5]


def test_the_gap_is_nvml_utilisation_sample_period_at_its_longest():
    assert CONFIRM_GAP_S == 1.0  # nvml.h: the utilisation sample period is between 1/6 s and 1 s


def test_a_reread_exactly_at_the_gap_waits_for_nothing():
    clock = Clock(now=101.0)
    _, clock = run([{0: (SLOW,)}], {}, last_read_at=100.0, clock=clock)
    assert clock.slept == [] and clock.rereads == 1

"""The per-rank rule's looks beyond the heartbeats (launch/watch/quiet_ranks.py), with the probe's answers given:
a rank that waits is excused and said once, one that does not is hung, one that went quiet meanwhile is looked at
before it is judged; a quiet rank's process that writes is making progress. The real probe (py-spy on real gloo
ranks) runs in tests/launch/test_rank_waits.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import ClassVar

import pytest

from podguard import console
from podguard.launch.watch import quiet_ranks
from podguard.launch.watch.hangs import Hang, ProgressWatch
from podguard.launch.watch.quiet_ranks import QuietRanks, write_count
from podguard.launch.watch.stack_model import RankStacks
from podguard.launch.watch.stacks import StackTarget
from podguard.rank.progress import Beat


class AnsweringProbe:
    """A probe that answers at once, from a table: slot -> (collective or None, error or None)."""

    answers: ClassVar[dict[int, tuple[str | None, str | None]]] = {}
    started: ClassVar[list[list[int]]] = []

    def __init__(self, on_done, **_) -> None:
        self.on_done = on_done
        self.running = False

    def running_for(self, now: float) -> float:
        return 0.0

    def start(self, targets: dict[int, StackTarget]) -> bool:
        self.started.append(sorted(targets))
        results = {}
        for slot, target in targets.items():
            collective, error = self.answers.get(slot, (None, None))
            results[slot] = RankStacks(target, None, (), "train.py:20 in main", error, 1.0, collective)
        self.on_done(results)
        return True


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> type[AnsweringProbe]:
    AnsweringProbe.answers, AnsweringProbe.started = {}, []
    monkeypatch.setattr(quiet_ranks, "RankProbe", AnsweringProbe)
    return AnsweringProbe


def three_ranks(now: float) -> ProgressWatch:
    watch = ProgressWatch(10.0, None, started_at=0.0)
    watch.beats({s: Beat(s, 1, 1, 1.0, 100 + s, rank=s) for s in range(3)}, 1.0)
    for t in range(2, int(now) + 1):
        watch.line("torchrun", "rank0:saving", float(t), rank=0)
    return watch


def judge(quiet: QuietRanks, watch: ProgressWatch, now: float, said: list[str], hung: list[Hang]) -> None:
    hang = watch.check(now)
    assert hang is not None and not hang.job
    with console.captured() as lines:  # (what it says: podguard lines)
        quiet.judge(hang, watch, now, on_loop=lambda fn: fn(), hung=hung.append, still=lambda: watch.check(now))
    said.extend(lines)


def test_ranks_that_wait_are_excused_and_said_once_naming_the_rank_that_moves(probe) -> None:
    probe.answers = {1: ("barrier", None), 2: ("barrier", None)}
    clock = [12.0]
    watch, quiet, said, hung = three_ranks(12.0), QuietRanks(10.0, None, clock=lambda: clock[0]), [], []
    judge(quiet, watch, 12.0, said, hung)
    assert hung == [] and probe.started == [[1, 2]]
    (line,) = said
    assert re.fullmatch(
        r"podguard: ranks 1-2 wait in barrier at train\.py:20 in main; rank 0 made progress \S+ ago: waiting for the "
        r"others, not hung",
        line,
    ), line
    assert watch.check(15.0) is None  # excused for a timeout
    for t in range(13, 23):
        watch.line("torchrun", "rank0:saving", float(t), rank=0)
    clock[0] = 22.5
    judge(quiet, watch, 22.5, said, hung)  # judged again: still waiting, nothing said again
    assert hung == [] and len(said) == 1


def test_a_rank_that_does_not_wait_or_whose_stacks_cannot_be_taken_is_hung(probe) -> None:
    probe.answers = {1: ("barrier", None), 2: (None, "ptrace not allowed: ...")}
    watch, quiet, said, hung = three_ranks(12.0), QuietRanks(10.0, None), [], []
    judge(quiet, watch, 12.0, said, hung)
    (found,) = hung
    assert found.slots == (2,) and found.ranks == (2,)
    assert said and said[0].startswith("podguard: rank 1 waits in barrier")


def test_a_rank_that_went_quiet_meanwhile_is_looked_at_before_it_is_judged(probe) -> None:
    probe.answers = {1: (None, None), 2: ("barrier", None)}
    watch, quiet, hung = three_ranks(12.0), QuietRanks(10.0, None), []
    hang = watch.check(12.0)
    only_1 = Hang(hang.silent_s, hang.last, (1,), (1,), job=False)
    widened = Hang(hang.silent_s, hang.last, (1, 2), (1, 2), job=False)
    with console.captured():
        quiet.judge(only_1, watch, 12.0, on_loop=lambda fn: fn(), hung=hung.append, still=lambda: widened)
    assert hung == []  # rank 2 has not been looked at yet: the next tick does


def test_a_quiet_rank_whose_process_writes_is_making_progress() -> None:
    code = "import sys, time\nfor i in range(60):\n    print(i, flush=True)\n    time.sleep(0.05)\n"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL) as proc:
        watch = ProgressWatch(4.0, None, started_at=0.0)
        now = time.monotonic()
        watch.beats({0: Beat(0, 1, 1, now - 3.0, proc.pid, rank=0)}, now)  # quiet for 3 s: more than half
        quiet = QuietRanks(4.0, None)
        quiet.sample(watch, now)  # the first look: its count so far
        time.sleep(0.5)
        quiet.sample(watch, time.monotonic())
        assert watch.rank_at(0) > now  # it wrote since: its own progress
        proc.kill()
    assert write_count(os.getpid()) is not None and write_count(2**22 + 3) is None
    strict = QuietRanks(4.0, re.compile("^step"))  # with --progress, writes are not progress
    watch = ProgressWatch(4.0, re.compile("^step"), started_at=0.0)
    watch.beats({0: Beat(0, 1, 1, 1.0, os.getpid(), rank=0)}, 1.0)
    strict.sample(watch, 4.0)
    strict.sample(watch, 5.0)
    assert watch.rank_at(0) == 1.0

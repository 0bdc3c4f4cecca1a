"""`podguard.rank.busy`: a long save or evaluation that the job announces (issue 30, item 1), and the watch's
rules for it, for a rank whose stack waits for the others, and for the save podguard asked for (item 5)."""

from __future__ import annotations

import subprocess
import sys
import timeit
from pathlib import Path

import pytest

from podguard.launch.watch.hangs import ProgressWatch
from podguard.rank import busy as busy_module
from podguard.rank import progress as hb
from podguard.rank.busy import busy
from podguard.rank.progress import Beat, Busy, create_board, read_slots


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = create_board(tmp_path / "hb", 4)
    monkeypatch.setenv(hb.ENV_FILE, str(path))
    monkeypatch.setenv("LOCAL_RANK", "1")
    hb._reset_for_tests()
    busy_module._depth = 0
    yield path
    hb._reset_for_tests()


def test_busy_writes_its_slot_and_its_end(board: Path) -> None:
    with busy("evaluating", max_s=600):
        (got,) = read_slots(board)[1].values()
        assert (got.slot, got.what, got.ended, got.max_s) == (1, "evaluating", None, 600.0)
        assert got.holds(got.since + 1) and not got.holds(got.since + 601)
    ended = read_slots(board)[1][1]
    assert ended.ended is not None and ended.ended >= ended.since and not ended.holds(ended.ended)


def test_nested_announcements_keep_the_outermost_and_start_end_are_idempotent(board: Path) -> None:
    outer = busy("saving").start()
    outer.start()
    with busy("a-very-long-name-cut"):
        assert read_slots(board)[1][1].what == "saving"
    assert read_slots(board)[1][1].ended is None  # the inner one ending does not end the outer one
    outer.end()
    outer.end()
    assert read_slots(board)[1][1].ended is not None


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), "10"])
def test_a_bound_that_is_not_a_positive_number_is_refused(bad) -> None:
    with pytest.raises(ValueError, match=r"busy\(max_s=.*\): expected a positive number of seconds"):
        busy("saving", max_s=bad)


def test_outside_podguard_busy_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hb.ENV_FILE, raising=False)
    hb._reset_for_tests()
    with busy("saving"):
        pass
    hb._reset_for_tests()


def test_a_board_without_busy_slots_an_older_podguard_s_is_left_alone(tmp_path, monkeypatch) -> None:
    path = tmp_path / "old"
    data = bytearray(hb.FIRST_SLOT + hb.SLOT_SIZE * 4)  # the old layout: heartbeat slots only
    hb.HEADER.pack_into(data, 0, hb.MAGIC, 4)
    path.write_bytes(bytes(data))
    monkeypatch.setenv(hb.ENV_FILE, str(path))
    monkeypatch.setenv("LOCAL_RANK", "3")
    hb._reset_for_tests()
    try:
        with busy("saving"):
            hb.heartbeat(5)
        beats, announced = read_slots(path)
        assert beats[3].step == 5 and announced == {}
    finally:
        hb._reset_for_tests()


def test_busy_costs_microseconds_and_makes_no_system_call(board: Path) -> None:
    def both() -> None:
        with busy("saving"):
            pass

    per_call = min(timeit.repeat(both, number=5000, repeat=3)) / 5000
    assert per_call < 100e-6  # loose: bench/bench_watch.py measures it
    code = (
        "from podguard.rank import busy, heartbeat\nheartbeat(0)\n"
        "for _ in range(2000):\n    with busy('saving'):\n        pass\n"
    )
    env = {"PATH": "/usr/bin:/bin", hb.ENV_FILE: str(board), "LOCAL_RANK": "0"}
    trace = subprocess.run(
        ["strace", "-f", "-c", "-e", "trace=all", sys.executable, "-c", code], env=env, capture_output=True, text=True
    ) if Path("/usr/bin/strace").exists() else None  # fmt: skip
    if trace is not None and trace.returncode == 0:
        calls = sum(int(line.split()[3]) for line in trace.stderr.splitlines()[2:-2] if len(line.split()) >= 5
                    and line.split()[3].isdigit())  # fmt: skip
        assert calls < 2000  # the interpreter's start-up, not one call per announcement


# --- the watch's rules ------------------------------------------------------------------------------------


def two_ranks(watch: ProgressWatch, at: float) -> None:
    watch.beats({0: Beat(0, 1, 1, at, 100, rank=0), 1: Beat(1, 1, 1, at, 101, rank=1)}, at)


def test_a_busy_rank_holds_its_own_clock_and_the_job_s_within_its_bound() -> None:
    watch = ProgressWatch(10.0, None, started_at=0.0)
    two_ranks(watch, 1.0)
    for t in range(2, 40):
        watch.busy({0: Busy(0, "saving", 2.0, None, 30.0)}, float(t))
        watch.excuse(1, float(t), "waits in barrier")  # (rank 1 waits for it: runtime.py's look at its stack)
        assert watch.check(float(t)) is None, t
    watch.busy({0: Busy(0, "saving", 2.0, None, 30.0)}, 40.0)
    hang = watch.check(45.0)  # past its bound (32) + the timeout: nothing else moves
    assert hang is not None and hang.job and hang.last == "rank 0 saving past its 30s bound, 13s ago"


def test_a_busy_span_that_ended_is_progress_when_it_ended() -> None:
    watch = ProgressWatch(10.0, None, started_at=0.0)
    two_ranks(watch, 1.0)
    watch.busy({0: Busy(0, "saving", 2.0, 20.0, 600.0), 1: Busy(1, "saving", 2.0, 20.0, 600.0)}, 25.0)
    assert watch.check(29.0) is None
    hang = watch.check(30.5)
    assert hang is not None and hang.job and "done saving" in hang.last


def test_an_excused_rank_is_judged_again_after_the_timeout_or_when_it_beats() -> None:
    watch = ProgressWatch(10.0, None, started_at=0.0)
    two_ranks(watch, 1.0)
    for t in range(2, 13):
        watch.line("GPU0", "saving", float(t), rank=0)  # rank 0's own lines: its progress
    hang = watch.check(12.0)
    assert hang is not None and not hang.job and hang.ranks == (1,)
    watch.excuse(1, 12.0, "waits in barrier")
    watch.line("GPU0", "saving", 20.0, rank=0)
    assert watch.check(20.0) is None
    assert watch.check(22.5).ranks == (1,)  # judged again
    watch.excuse(1, 22.5, "waits in barrier")
    watch.beats({1: Beat(1, 2, 2, 23.0, 101, rank=1)}, 23.0)
    assert 1 not in watch.excused  # it beats again: judged afresh


def test_the_clock_stands_still_while_held_and_the_silence_before_counts_on() -> None:
    watch = ProgressWatch(12.0, None, started_at=0.0)
    watch.line("GPU0", "step 9", 5.0)
    watch.hold(10.0, 60.0)  # 5 s of silence so far
    assert watch.check(50.0) is None
    watch.release(40.0)  # the save is over: 30 s stood still
    assert watch.check(46.9) is None
    assert watch.check(47.0) is not None  # 5 s before + 7 s after
    bounded = ProgressWatch(12.0, None, started_at=0.0)
    bounded.hold(0.0, 20.0)
    assert bounded.check(19.0) is None
    assert bounded.check(32.5) is not None  # the hold ran out at 20: 12 s later, hung


def test_a_rank_whose_process_writes_is_making_progress_only_without_a_pattern() -> None:
    watch = ProgressWatch(10.0, None, started_at=0.0)
    two_ranks(watch, 1.0)
    watch.line("job", "x", 11.0)
    watch.rank_wrote(0, 11.0)
    assert watch.check(11.5).ranks == (1,)
    strict = ProgressWatch(10.0, __import__("re").compile("^step"), started_at=0.0)
    two_ranks(strict, 1.0)
    strict.rank_wrote(0, 11.0)
    assert strict.rank_at(0) == 1.0

"""Progress and hangs (launch/watch/hangs.py), stragglers (stragglers.py) and heartbeats (rank/progress.py):
the rules on their own, with the time passed in."""

from __future__ import annotations

import re
import subprocess
import sys
import timeit
from pathlib import Path

import pytest

from podguard.launch.watch.hangs import ProgressWatch
from podguard.launch.watch.stragglers import PERSIST, StepRates
from podguard.rank import progress as hb
from podguard.rank.progress import Beat, create_board, read_board


def beat(slot: int, count: int, at: float, step: int | None = None) -> dict[int, Beat]:
    return {slot: Beat(slot, count, step, at, 100 + slot)}


# --- progress and hangs -----------------------------------------------------------------------------------


def test_no_output_at_all_is_a_hang_counted_from_the_launch():
    watch = ProgressWatch(30.0, None, started_at=100.0)
    assert watch.check(129.9) is None
    hang = watch.check(130.0)
    assert hang is not None and hang.ranks == () and hang.silent_s == 30.0
    assert hang.text == "no progress for 30s (last progress: none since launch 30s ago)"


def test_any_line_is_progress_by_default_and_moves_the_clock():
    watch = ProgressWatch(30.0, None, started_at=100.0)
    watch.line("GPU1", "  epoch 3 loss 1.25 ", 125.0)
    assert watch.check(150.0) is None
    hang = watch.check(155.0)
    assert hang is not None and hang.last == "GPU1: 'epoch 3 loss 1.25', 30s ago"
    assert not watch.progressed  # no pattern matched, no heartbeat: nothing measurable for the crash-loop rule


def test_with_a_pattern_only_matching_lines_count_and_noise_is_ignored():
    watch = ProgressWatch(10.0, re.compile(r"step \d+"), started_at=0.0)
    watch.line("GPU0", "step 1 loss 3.2", 1.0)
    for t in range(2, 30):
        watch.line("GPU0", "WARNING: some library warning", float(t))  # noise, every second
    hang = watch.check(11.0)
    assert hang is not None and "step 1 loss 3.2" in hang.last and watch.progressed


def test_a_long_line_is_cut_in_the_message():
    watch = ProgressWatch(5.0, None, started_at=0.0)
    watch.line("rank0", "x" * 500, 1.0)
    assert watch.check(6.0).last == f"rank0: {'x' * 80!r}..., 5s ago"


def test_a_rank_whose_heartbeats_stop_is_hung_while_another_keeps_printing():
    watch = ProgressWatch(20.0, None, started_at=0.0)
    watch.beats({**beat(0, 1, 1.0, 1), **beat(1, 1, 1.0, 1)}, 1.0)
    for t in range(2, 40):
        watch.line("GPU0", f"rank 0 still printing {t}", float(t))  # rank 0 prints but its heartbeats stop too
        watch.beats(beat(0, t, float(t), t), float(t))  # rank 0 keeps beating
    hang = watch.check(21.0)
    assert hang is not None and hang.ranks == (1,)
    said = "rank(s) 1: no progress (heartbeat) for 20s (last progress: heartbeat of rank 1 (step 1), 20s ago)"
    assert hang.text == said


def test_a_steady_job_is_never_hung():
    watch = ProgressWatch(3.0, None, started_at=0.0)
    for t in range(1, 1000):
        watch.beats(beat(0, t, t * 0.5, t), t * 0.5)
        watch.line("GPU0", "ok", t * 0.5)
        assert watch.check(t * 0.5 + 0.1) is None


def test_an_unchanged_heartbeat_is_not_progress_and_a_future_time_is_clamped():
    watch = ProgressWatch(10.0, None, started_at=0.0)
    assert watch.beats(beat(0, 1, 2.0), 2.0) == [0]
    assert watch.beats(beat(0, 1, 2.0), 5.0) == []  # the same count: nothing new
    assert watch.beats(beat(0, 2, 99.0), 6.0) == [0] and watch.rank_last[0][0] == 6.0
    assert watch.progressed


def test_a_rank_that_torchrun_restarted_beats_again_even_at_its_old_count():
    """torchrun's --max-restarts: the new process of rank 0 counts from 1 again, and may be at the old count when
    the board is read; a new pid is a new beat (it was ignored: the new rank was never judged on its own)."""
    watch = ProgressWatch(10.0, None, started_at=0.0)
    assert watch.beats({0: Beat(0, 3, None, 2.0, 500)}, 2.0) == [0]
    restarted = {0: Beat(0, 3, None, 30.0, 777)}  # the old rank died at its 3rd beat; the new one is at its 3rd
    assert watch.beats(restarted, 30.0) == [0] and watch.rank_last[0] == (30.0, None, 777)
    assert watch.beats(restarted, 31.0) == []  # (then: unchanged is unchanged)
    watch.line("GPU0", "eval done", 44.0)
    assert watch.check(45.0, alive=lambda pid: False) is None and 0 not in watch.rank_last  # ended: forgotten
    assert watch.beats(restarted, 46.0) == []  # and its last beat, still on the board, is not progress again


def test_next_due_is_the_earliest_possible_hang_and_off_without_a_timeout():
    watch = ProgressWatch(10.0, None, started_at=0.0)
    watch.beats(beat(0, 1, 3.0), 3.0)
    watch.line("GPU0", "x", 7.0)
    assert watch.next_due(8.0) == 13.0
    assert ProgressWatch(None, None, 0.0).next_due(5.0) is None
    assert ProgressWatch(None, None, 0.0).check(1e9) is None


def test_hang_records_are_data():
    watch = ProgressWatch(1.0, None, started_at=0.0)
    assert watch.check(2.5).to_dict() == {
        "silent_s": 2.5,
        "last": "none since launch 2.5s ago",
        "ranks": [],
        "local_ranks": [],
        "text": "no progress for 2.5s (last progress: none since launch 2.5s ago)",
    }


# --- stragglers -------------------------------------------------------------------------------------------


def feed(rates: StepRates, per_rank_period: dict[int, float], until: float) -> None:
    for slot, period in per_rank_period.items():
        step, t = 0, 0.0
        while t <= until:
            rates.observe(slot, step, t)
            step, t = step + 1, t + period


def test_a_half_speed_rank_is_named_slow_after_persisting_and_once():
    rates = StepRates(0.8)
    feed(rates, {0: 0.1, 1: 0.1, 2: 0.2, 3: 0.1}, until=10.0)
    found = [rates.check(10.0 + i) for i in range(PERSIST + 2)]
    assert found[: PERSIST - 1] == [[]] * (PERSIST - 1)
    (slow,) = found[PERSIST - 1]
    assert slow.slot == 2 and slow.rate == pytest.approx(5.0) and slow.median == pytest.approx(10.0)
    assert found[PERSIST:] == [[], []]  # named once
    assert slow.text == "rank 2 is slow: 5 steps/s, below 0.8 x its peers' median 10 steps/s"
    assert list(rates.named) == [2] and rates.named[2].count == 1


def wobble(rates: StepRates, episodes: int) -> list[list[object]]:
    """Rank 1 alternates between half speed and full speed (each phase long enough to be named slow)."""
    steps = {0: 0, 1: 0}
    t, warned = 0.0, []
    for episode in range(episodes * 2):
        slow = episode % 2 == 0
        share = 0.3 if episode == 4 else 0.5  # its worst episode is the third slow one
        for _ in range(120):
            t += 0.1
            for slot in (0, 1):
                steps[slot] += 1 if slot == 0 or not slow or _ % round(1 / share) == 0 else 0
                rates.observe(slot, steps[slot], t)
            if _ % 8 == 7:
                warned.append(rates.check(t))
    return warned


def test_a_wobbling_straggler_is_recorded_once_with_a_count_and_its_worst_share():
    from podguard.launch.watch.runtime import RuntimeSettings, RuntimeWatch

    rates = StepRates(0.8)
    warned = [w for w in wobble(rates, episodes=30) if w]
    assert len(warned) >= 20  # warned each time it became slow again (a line each) ...
    assert list(rates.named) == [1]  # ... but recorded once, however long it wobbles
    record = rates.named[1]
    assert record.count == len(warned) and record.worst.share == pytest.approx(0.3, abs=0.08)
    watch = RuntimeWatch(RuntimeSettings(), Path("/nonexistent"))
    watch.rates = rates
    text = watch.stragglers_text()
    assert text.startswith(f"stragglers: rank 1 x{record.count} (worst 0.") and len(text) < 80
    assert len(watch.record()["stragglers"]) == 1 and watch.record()["stragglers"][0]["times"] == record.count


def test_equal_ranks_and_a_ratio_of_zero_name_nobody():
    rates = StepRates(0.8)
    feed(rates, {0: 0.1, 1: 0.1, 2: 0.11}, until=10.0)
    assert all(rates.check(10.0 + i) == [] for i in range(6))
    off = StepRates(0)
    feed(off, {0: 0.1, 1: 1.0}, until=20.0)
    assert all(off.check(20.0 + i) == [] for i in range(6))


def test_two_ranks_compare_with_each_other():
    rates = StepRates(0.8)
    feed(rates, {0: 0.1, 1: 0.3}, until=12.0)
    assert [s.slot for i in range(PERSIST) for s in rates.check(12.0 + i)] == [1]


def test_the_rate_uses_the_last_twenty_steps_or_five_minutes():
    rates = StepRates(0.8)
    for step in range(0, 100):
        rates.observe(0, step, step * 1.0 if step < 80 else 80 + (step - 80) * 0.1)  # speeds up at step 80
    assert rates.rate(0, 82.0) == pytest.approx(10.0)  # the last 20 steps: 0.1 s each
    slow = StepRates(0.8)
    for step in range(0, 10):
        slow.observe(0, step, step * 100.0)  # a step every 100 s: only 3 steps fit in 5 minutes
    assert slow.rate(0, 900.0) == pytest.approx(0.01)
    assert StepRates(0.8).rate(0, 1.0) is None


def test_a_step_that_goes_back_starts_the_history_again():
    rates = StepRates(0.8)
    for step in range(10):
        rates.observe(0, step, float(step))
    rates.observe(0, 2, 11.0)  # a new epoch counter
    assert rates.rate(0, 11.0) is None
    rates.observe(0, 2, 12.0)  # the same step again: ignored
    assert rates.rate(0, 12.0) is None


# --- heartbeats ---------------------------------------------------------------------------------------------


def test_heartbeat_writes_its_slot_and_read_board_sees_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    board = create_board(tmp_path / "hb", 4)
    monkeypatch.setenv(hb.ENV_FILE, str(board))
    monkeypatch.setenv("LOCAL_RANK", "2")
    hb._reset_for_tests()
    try:
        hb.heartbeat(7)
        hb.heartbeat()
        (got,) = read_board(board).values()
        assert (got.slot, got.count, got.step) == (2, 2, None)
        hb.heartbeat(9)
        assert read_board(board)[2].step == 9
    finally:
        hb._reset_for_tests()


@pytest.mark.parametrize(
    ("env", "why"),
    [({}, "not under podguard"), ({"LOCAL_RANK": "9"}, "a slot past the board"), ({"LOCAL_RANK": "x"}, "a bad rank")],
)
def test_heartbeat_is_a_silent_no_op_where_it_cannot_write(tmp_path, monkeypatch, env, why):
    board = create_board(tmp_path / "hb", 4)
    if env:
        monkeypatch.setenv(hb.ENV_FILE, str(board))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    hb._reset_for_tests()
    try:
        hb.heartbeat(1)  # never raises into a training loop
        assert read_board(board) == {}, why
    finally:
        hb._reset_for_tests()


def test_a_missing_or_foreign_board_reads_as_empty(tmp_path: Path):
    assert read_board(tmp_path / "none") == {}
    (tmp_path / "junk").write_bytes(b"x" * 200)
    assert read_board(tmp_path / "junk") == {}


def test_heartbeat_from_real_processes_uses_each_local_rank(tmp_path: Path):
    board = create_board(tmp_path / "hb", 3)
    code = "from podguard.rank import heartbeat\nfor s in range(5): heartbeat(s)\n"
    for rank in range(3):
        env = {"PATH": "/usr/bin:/bin", hb.ENV_FILE: str(board), "LOCAL_RANK": str(rank)}
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert {s: (b.count, b.step) for s, b in read_board(board).items()} == {0: (5, 4), 1: (5, 4), 2: (5, 4)}


def test_heartbeat_costs_microseconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(hb.ENV_FILE, str(create_board(tmp_path / "hb", 1)))
    hb._reset_for_tests()
    try:
        per_call = min(timeit.repeat(lambda: hb.heartbeat(1), number=20000, repeat=3)) / 20000
        assert per_call < 50e-6  # a loose bound for shared CI machines; bench/bench_watch.py measures it
    finally:
        hb._reset_for_tests()


def test_a_rank_whose_process_ended_is_forgotten_not_hung():
    watch = ProgressWatch(10.0, None, started_at=0.0)
    watch.beats({**beat(0, 1, 1.0), **beat(1, 1, 1.0)}, 1.0)
    watch.beats(beat(0, 2, 14.0), 14.0)  # rank 0 goes on; rank 1 beat once and finished its share (exited 0)
    ended = {101}
    assert watch.check(15.0, alive=lambda pid: pid not in ended) is None
    assert 1 not in watch.rank_last
    hang = ProgressWatch(10.0, None, started_at=0.0)
    hang.beats({**beat(0, 1, 1.0), **beat(1, 1, 1.0)}, 1.0)
    hang.beats(beat(0, 2, 14.0), 14.0)
    found = hang.check(15.0, alive=lambda pid: True)  # still running, still silent: hung
    assert found is not None and found.ranks == (1,)


def test_hung_ranks_are_named_by_their_global_rank():
    watch = ProgressWatch(10.0, None, started_at=0.0)
    watch.beats({1: Beat(1, 1, 5, 1.0, 101, rank=9), 0: Beat(0, 1, 5, 1.0, 100, rank=8)}, 1.0)
    watch.beats({0: Beat(0, 2, 6, 14.0, 100, rank=8)}, 14.0)
    hang = watch.check(15.0)
    assert hang is not None and hang.ranks == (9,) and hang.slots == (1,)
    assert "rank(s) 9: no progress (heartbeat)" in hang.text and "heartbeat of rank 9 (step 5)" in hang.text


def test_a_launcher_prefix_is_stripped_before_an_anchored_progress_pattern():
    from podguard.launch.prefix import prefix_pattern

    strip = prefix_pattern("rank{rank}:")
    watch = ProgressWatch(10.0, re.compile(r"^step \d+"), started_at=0.0, strip=strip)
    watch.line("torchrun", "rank3: loading shards", 4.0)
    assert not watch.matched
    watch.line("torchrun", "rank3: step 12 loss 2.0", 5.0)
    assert watch.matched and watch.last_at == 5.0
    plain = ProgressWatch(10.0, re.compile(r"^step \d+"), started_at=0.0, strip=strip)
    plain.line("GPU0", "step 1", 2.0)  # a line without the prefix is matched as it is
    assert plain.matched


def test_nothing_seen_is_no_progress_whatever_the_duration():
    watch = ProgressWatch(10.0, None, started_at=0.0)
    assert not watch.seen
    watch.line("GPU0", "hello", 1.0)
    assert watch.seen


def test_heartbeat_never_raises_and_records_the_global_rank(tmp_path, monkeypatch):
    board = create_board(tmp_path / "board", 2)
    monkeypatch.setenv("PODGUARD_HEARTBEAT_FILE", str(board))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "9")
    hb._reset_for_tests()
    try:
        for bad in (2**64, -5, "abc", object(), 3.7):
            hb.heartbeat(bad)  # type: ignore[arg-type]
        beat = read_board(board)[1]
        assert beat.count == 5 and beat.step == 3 and beat.rank == 9 and beat.label == 9  # 3.7 -> step 3
        hb.heartbeat(41)
        assert read_board(board)[1].step == 41
    finally:
        hb._reset_for_tests()


def test_a_fault_on_the_workers_own_gpu_is_named_first_else_any_fatal_fault(tmp_path):
    from podguard.launch.watch.gpu_faults import GpuFault
    from podguard.launch.watch.runtime import RuntimeSettings, RuntimeWatch

    watch = RuntimeWatch(RuntimeSettings(), tmp_path)
    app = GpuFault(0, "GPU-0", "xid", 31, False, "GPU 0: Xid 31", 1.0)
    peer = GpuFault(0, "GPU-0", "lost", 79, True, "GPU 0: lost", 2.0)
    own = GpuFault(1, "GPU-1", "xid", 95, True, "GPU 1: Xid 95", 3.0)
    watch.faults = [app]
    assert watch.fault_of((1,)) is None and watch.cause_of_exit((1,), 1) is None  # application Xids are not causes
    watch.faults = [app, peer, own]
    assert watch.fault_of((1,)) is own and watch.fault_of((2,)) is peer and watch.fault_of(()) is peer
    assert watch.cause_of_exit((1,), 1) == (76, "GPU FAULT first: GPU 1: Xid 95")
    assert watch.cause_of_exit((1,), 0) is None


def test_a_lockstep_job_whose_beats_all_stop_in_one_tick_names_the_rank_left_behind():
    """Issue 23 item 16 (W2): in lockstep DDP every rank stops beating at once (the others wait in all_reduce), so the
    job-wide rule fired first and the HUNG line named no rank. The rank whose step is behind is named."""
    watch = ProgressWatch(10.0, None, started_at=0.0)
    watch.beats({0: Beat(0, 41, 41, 5.0, 100, rank=0), 1: Beat(1, 40, 40, 4.9, 101, rank=1)}, 5.0)
    hang = watch.check(15.5)
    assert hang is not None and hang.ranks == (1,) and hang.text.startswith("rank(s) 1: ")
    even = ProgressWatch(10.0, None, started_at=0.0)  # all at the same step: nobody is behind, nobody is named
    even.beats({0: Beat(0, 41, 41, 5.0, 100), 1: Beat(1, 41, 41, 4.9, 101)}, 5.0)
    hung = even.check(15.5)
    assert hung is not None and hung.ranks == ()

"""`--restarts` (job/restarts.py) and the END/RESTART lines a keeper reads (outcome_lines.py): the rules alone."""

from __future__ import annotations

import pytest

from podguard.job.restarts import CRASH_LOOP, FIRST_MINUTE_S, MAX_DELAY_S, Failure, RestartPolicy, made_progress
from podguard.outcome_lines import END_LINE, KINDS, end_line, restart_line

CRASH = Failure(1, "crash", "", progressed=False)
HANG = Failure(79, "hang", "no progress", progressed=False)


def test_no_restarts_by_default():
    decision = RestartPolicy(0).after(CRASH)
    assert not decision.restart and decision.reason == "no restarts (--restarts 0)"


def test_n_restarts_then_stop_when_each_failure_differs():
    policy = RestartPolicy(2)
    first = policy.after(Failure(1, "crash", "", progressed=False))
    second = policy.after(Failure(2, "crash", "", progressed=False))
    third = policy.after(Failure(3, "crash", "", progressed=False))
    assert (first.restart, first.reason) == (True, "restart 1 of 2")
    assert (second.restart, second.reason) == (True, "restart 2 of 2")
    assert (third.restart, third.reason) == (False, "all 2 restart(s) used (--restarts 2)")


def test_three_identical_failures_before_any_progress_are_a_crash_loop():
    policy = RestartPolicy(10)
    assert policy.after(HANG).restart and policy.after(HANG).restart
    stop = policy.after(HANG)
    assert not stop.restart
    assert stop.reason == "crash loop: 3 attempts in a row failed the same way (hang (no progress)) before any progress"
    assert CRASH_LOOP == 3


@pytest.mark.parametrize(
    "third",
    [
        Failure(1, "crash", "", progressed=True),  # this one made progress
        Failure(2, "crash", "", progressed=False),  # another exit code
        Failure(1, "hang", "", progressed=False),  # another kind
        Failure(76, "gpu_fault", "GPU 3 Xid 79", progressed=False),
    ],
)
def test_a_different_or_progressing_failure_is_no_crash_loop(third: Failure):
    policy = RestartPolicy(10)
    policy.after(CRASH)
    policy.after(CRASH)
    assert policy.after(third).restart


def test_progress_in_between_breaks_the_streak():
    policy = RestartPolicy(10)
    for failure in (CRASH, CRASH, Failure(1, "crash", "", progressed=True), CRASH, CRASH):
        assert policy.after(failure).restart
    assert not policy.after(CRASH).restart


def test_the_pause_doubles_without_progress_and_starts_again_after_it():
    policy = RestartPolicy(20)
    delays = [policy.after(Failure(i, "crash", "", progressed=False)).delay_s for i in range(1, 9)]
    assert delays == [1, 2, 4, 8, 16, 32, MAX_DELAY_S, MAX_DELAY_S]
    assert policy.after(Failure(99, "crash", "", progressed=True)).delay_s == 1


@pytest.mark.parametrize(
    ("matched", "beating", "watched", "duration", "expected"),
    [
        (True, False, True, 1.0, True),  # a --progress match
        (False, True, True, 1.0, True),  # a heartbeat
        (False, False, True, 3600.0, False),  # --progress given, never matched: no progress however long
        (False, False, False, FIRST_MINUTE_S, True),  # neither in use: a minute counts as progress
        (False, False, False, FIRST_MINUTE_S - 0.1, False),
    ],
)
def test_what_counts_as_progress(matched, beating, watched, duration, expected):
    assert made_progress(matched=matched, beating=beating, watched=watched, duration_s=duration) is expected


def test_failure_text_and_signature():
    assert CRASH.text == "crash" and HANG.text == "hang (no progress)"
    assert Failure(76, "gpu_fault", "GPU 3 Xid 79", False).text == "gpu fault (GPU 3 Xid 79)"
    assert CRASH.signature != Failure(2, "crash", "", False).signature


def test_the_end_line_is_one_line_the_keeper_parses():
    line = end_line("train", "gpu-fault", 76, 2, "GPU FAULT first: GPU 3 (GPU-x): Xid 79\nthen ...")
    assert "\n" not in line
    assert (
        line
        == "podguard train: END gpu-fault exit 76 after 2 attempt(s): GPU FAULT first: GPU 3 (GPU-x): Xid 79 then ..."
    )
    m = END_LINE.match(line)
    assert m is not None and m.group("kind", "code", "command") == ("gpu-fault", "76", "train")
    assert end_line("run", "success", 0, 1, "") == "podguard run: END success exit 0 after 1 attempt(s)"
    assert all(END_LINE.match(end_line("run", kind, 1, 1, "x")) for kind in KINDS)
    with pytest.raises(ValueError, match="unknown end kind"):
        end_line("run", "weird", 1, 1, "")
    assert END_LINE.match("podguard train: PASS on 8 GPU(s) in 12 ms") is None  # the preflight line is not an end


def test_the_restart_line():
    assert restart_line("train", 1, 3, 2.0, "hang (no progress)", 79) == (
        "podguard train: RESTART 1 of 3 in 2 s after hang (no progress), exit 79"
    )

"""A keeper that is ending is never cut in two by a signal (pods/keeper/interrupt.py).

`pod down` writes its word to the record, then SIGTERMs the keepers on the machine. A keeper that read the word first
(its fence raised Superseded) used to meet that SIGTERM with the handler already gone: it died by the signal (-15)
half-way through writing its last state. Seen once in a full run under load
(`test_pod_down_or_stop_during_a_capacity_wait_ends_the_keeper[down]`: exit -15); here it is made certain, with
real processes and real signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from podguard.pods.keeper.interrupt import Interrupted, held, signals_raise

ENDING_AFTER_THE_WORD = textwrap.dedent(
    """
    import os, signal, sys, time
    from podguard.pods.keeper.fence import Fence, Superseded
    from podguard.pods.keeper.intent import Intent, Word
    from podguard.pods.keeper.interrupt import signals_raise

    class Store:  # the record: `pod down` wrote its word over this keep's
        def read(self):
            return Intent(Word.DOWN, 4, by="pod down")

    mine = Intent(Word.KEPT, 3, "k3-aa")
    with signals_raise():
        try:
            Fence(Store(), mine).check()
        except Superseded:
            os.kill(os.getpid(), signal.SIGTERM)  # pod down's SIGTERM, while the keeper writes its last state
            time.sleep(0.2)
            with open(sys.argv[1], "w") as f:
                f.write("done: down")
    sys.exit(0)
    """
)


def test_a_keeper_that_read_the_users_word_finishes_its_end_through_pod_downs_sigterm(tmp_path) -> None:
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-c", ENDING_AFTER_THE_WORD, str(state)], capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert state.read_text() == "done: down"


def test_after_the_first_signal_a_second_one_is_noted_not_raised_in_the_middle_of_the_end() -> None:
    with signals_raise():
        with pytest.raises(Interrupted) as first:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.0)  # (a bytecode boundary: the handler has run)
        os.kill(os.getpid(), signal.SIGHUP)  # while the keeper ends: noted, the end goes on
    assert first.value.signum == signal.SIGTERM


def test_a_new_keeper_in_the_same_process_is_interrupted_again() -> None:
    for _ in range(2):
        with signals_raise(), pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.0)


def test_a_signal_inside_held_waits_for_the_block_then_ends_the_keeper() -> None:
    # a create in flight: its answer comes first (the keeper remembers the pod), then the SIGTERM is raised
    done = []
    with signals_raise(), pytest.raises(Interrupted) as raised, held():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.0)
        done.append("answer")
    assert done == ["answer"] and raised.value.signum == signal.SIGTERM and str(raised.value) == "SIGTERM"


def test_a_block_without_a_signal_ends_quietly_and_the_handlers_come_back() -> None:
    def before(signum: int, frame: object) -> None:  # (whatever the process had)
        raise AssertionError("not expected")

    old = signal.signal(signal.SIGHUP, before)
    try:
        with signals_raise():
            with held():
                pass
            assert signal.getsignal(signal.SIGHUP) is not before
        assert signal.getsignal(signal.SIGHUP) is before
    finally:
        signal.signal(signal.SIGHUP, old)


def test_nested_held_blocks_raise_once_at_the_outer_end() -> None:
    reached = []
    with signals_raise(), pytest.raises(Interrupted), held():
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.0)
        reached.append("the outer block goes on")
    assert reached == ["the outer block goes on"]

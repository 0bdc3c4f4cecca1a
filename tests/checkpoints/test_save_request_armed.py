"""`SaveRequest` costs nothing in a job nobody asks to save: unarmed it installs no handler and `take()` makes no
collective; under `--save-signal` (PODGUARD_SAVE_SIGNAL) or with an explicit signal it answers the signal."""

from __future__ import annotations

import os
import signal

import pytest

from podguard.rank.resume import SaveRequest


@pytest.fixture(autouse=True)
def _restore_usr1():
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


def test_without_a_save_signal_it_is_unarmed_and_free(monkeypatch) -> None:
    monkeypatch.delenv("PODGUARD_SAVE_SIGNAL", raising=False)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    request = SaveRequest()
    assert not request.armed
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # no handler: nothing was asked for
    assert request.take() is False


@pytest.mark.parametrize("value", ["USR1", "SIGUSR1", "10"])
def test_under_save_signal_it_answers_the_signal_once(monkeypatch, value: str) -> None:
    monkeypatch.setenv("PODGUARD_SAVE_SIGNAL", value)
    request = SaveRequest()
    assert request.armed and request.signum == signal.SIGUSR1
    assert request.take() is False
    os.kill(os.getpid(), signal.SIGUSR1)
    assert request.take() is True
    assert request.take() is False  # taken once


def test_an_explicit_signal_arms_it_without_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("PODGUARD_SAVE_SIGNAL", raising=False)
    request = SaveRequest(signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert request.armed and request.take() is True

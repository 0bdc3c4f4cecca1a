"""The guards' rules without processes: how durations and amounts are read, when each guard is due, and the idle
test (the end-to-end behaviour with real processes: tests/pods/test_pods_guards.py)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from podguard import console
from podguard.durations import format_duration, parse_duration, parse_usd
from podguard.errors import UsageError
from podguard.guards.sampler import IdleTracker, is_idle
from podguard.guards.settings import GuardSettings
from podguard.guards.watch import GuardWatch, Phase
from podguard.pods.thispod.meter import Budget, Meter


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("45", 45), ("0.5", 0.5), (" 2H ", 7200), ("1.5h", 5400)],
)
def test_durations(raw, seconds):
    assert parse_duration(raw, "--idle-stop") == seconds


@pytest.mark.parametrize("raw", ["0", "off", "OFF", "", None, "0s"])
def test_zero_or_off_disables(raw):
    assert parse_duration(raw, "--idle-stop") is None
    assert parse_usd(raw if raw != "0s" else "0", "--max-cost") is None


@pytest.mark.parametrize("raw", ["5x", "-1", "1h30m", "h", "1e9999", "nan", "inf"])
def test_bad_durations_name_the_value_and_what_is_valid(raw):
    with pytest.raises(UsageError) as info:
        parse_duration(raw, "--max-runtime")
    assert f"--max-runtime={raw!r}" in info.value.message and "90s, 30m, 2h, 1d" in info.value.message


@pytest.mark.parametrize(("raw", "usd"), [("150", 150.0), ("$12.5", 12.5), (3, 3.0)])
def test_amounts(raw, usd):
    assert parse_usd(raw, "--max-cost") == usd


@pytest.mark.parametrize("raw", ["-3", "lots", "nan", "inf", True])
def test_bad_amounts(raw):
    with pytest.raises(UsageError, match="expected US dollars"):
        parse_usd(raw, "--max-cost")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.5, "0.5s"), (1, "1s"), (42, "42s"), (310, "5m10s"), (5400, "1h30m"), (183600, "2d3h")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_idle_means_every_gpu_at_or_below_5_percent_and_known():
    assert is_idle((0, 5, 3)) and not is_idle((0, 6)) and not is_idle((0, None)) and not is_idle(())
    tracker = IdleTracker()
    assert tracker.update((0, 0), 10.0) == 0.0
    assert tracker.update((1, 2), 12.5) == 2.5
    assert tracker.update((0, 90), 13.0) == 0.0  # one busy GPU resets the count
    assert tracker.update((0, 0), 14.0) == 0.0 and tracker.update((0, 0), 20.0) == 6.0


def test_runtime_and_cost_are_deadlines_not_polls():
    settings = GuardSettings(max_runtime_s=60.0, max_cost_usd=10.0)
    budget = Budget("pod1", (Meter("pod1", cost_per_hr=3.6, uptime_s=9000.0),), read_at=100.0)  # $9 spent: $1 left
    watch = GuardWatch(settings, budget)
    watch.begin(Phase.JOB, 100.0)
    assert watch.next_delay(100.0) == pytest.approx(60.0)  # runtime first; $1 at $3.6/hr is 1000 s away
    assert watch.check(159.0) is None
    trip = watch.check(160.0)
    assert trip is not None and trip.guard == "--max-runtime" and "has run 1m (limit 1m)" in trip.detail
    after = GuardWatch(settings, budget)
    after.begin(Phase.AFTER, 100.0)  # the job's runtime does not count after the job
    assert after.next_delay(100.0) == pytest.approx(1000.0)
    assert after.check(1099.0) is None
    trip = after.check(1100.0)
    assert trip is not None and trip.guard == "--max-cost" and "about $10.00" in trip.detail


def test_settings_come_from_the_options_and_the_interval_variable():
    opts = {"idle_stop_s": 1800.0, "max_runtime_s": None, "max_cost_usd": 150.0}
    settings = GuardSettings.configured(**opts, env={"PODGUARD_GUARD_INTERVAL": "0.25"})
    assert (settings.idle_stop_s, settings.max_runtime_s, settings.max_cost_usd) == (1800.0, None, 150.0)
    assert settings.interval_s == 0.25 and settings.active and settings.after_job
    assert not GuardSettings.configured(idle_stop_s=None, max_runtime_s=None, max_cost_usd=None, env={}).active
    with pytest.raises(UsageError, match="PODGUARD_GUARD_INTERVAL='soon'"):
        GuardSettings.configured(**opts, env={"PODGUARD_GUARD_INTERVAL": "soon"})


def test_describe_names_the_guards_that_are_on_and_nothing_when_none_is():
    budget = Budget("p1", (Meter("p1", 3.6, 1000.0),), read_at=time.monotonic() + 3600)  # $1.00, not moving yet
    watch = GuardWatch(GuardSettings(idle_stop_s=1800.0, max_runtime_s=7200.0, max_cost_usd=150.0), budget)
    cost = "--max-cost $150.00 (pod p1: about $1.00 spent so far)"
    assert watch.describe() == f"billing guards: --idle-stop 30m, --max-runtime 2h, {cost}"
    watch.begin(Phase.AFTER, time.monotonic())  # after the job its runtime is no longer watched
    assert watch.describe() == f"billing guards: --idle-stop 30m, {cost}"
    with console.captured() as said:
        cpu_only = GuardWatch(GuardSettings(idle_stop_s=60.0), None)
        cpu_only.watch_gpus([])  # --idle-stop is ignored (one warning): no guard is left, so no "billing guards:" line
        assert cpu_only.describe() == ""
        assert GuardWatch(GuardSettings(max_cost_usd=5.0), None).describe() == ""  # no price: it is off
    assert said == ["podguard: warning: --idle-stop is ignored: this run has no GPU to watch (CPU only)"]


def test_the_idle_line_after_the_job_has_no_empty_guard_list(capsys):
    from podguard.guards.end import idle_guarded

    cpu_only = GuardWatch(GuardSettings(idle_stop_s=60.0), None)
    cpu_only.watch_gpus([])
    timer = threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGTERM))  # held there
    timer.start()
    try:
        code = idle_guarded(0, None, cpu_only)
    finally:
        timer.cancel()
    err = capsys.readouterr().err
    assert code == 0 and "billing guards" not in err and ";  ;" not in err
    assert "Idling to keep the container up (--on-exit idle); stop the pod or send SIGTERM to end" in err

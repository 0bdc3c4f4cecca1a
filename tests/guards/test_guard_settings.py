"""The guard settings and the checks before anything runs: which guards are on, which keep watching after the job,
the sampling interval, and `--max-cost`'s need for this pod's id and an API key (64 without them)."""

from __future__ import annotations

import pytest

from podguard.errors import ExitCode, UsageError
from podguard.guards.sampler import is_idle
from podguard.guards.settings import (
    DEFAULT_INTERVAL_S,
    ENV_INTERVAL,
    IDLE_UTILIZATION_PCT,
    GuardSettings,
    check_guards,
)
from podguard.job.configure import configure
from podguard.job.options import JobOptions
from podguard.preflight.options import PreflightOptions

KEY = "rpa_TESTKEY0123456789abcdefghijklmnopqrstuvwxyz"


def test_the_constants_are_the_documented_ones():
    assert (IDLE_UTILIZATION_PCT, DEFAULT_INTERVAL_S, ENV_INTERVAL) == (5, 10.0, "PODGUARD_GUARD_INTERVAL")
    assert is_idle((IDLE_UTILIZATION_PCT,)) and not is_idle((IDLE_UTILIZATION_PCT + 1,))
    assert GuardSettings().interval_s == 10.0 and not GuardSettings().active


OFF = {"idle_stop_s": None, "max_runtime_s": None, "max_cost_usd": None}


def test_each_option_reaches_its_own_setting():
    s = GuardSettings.configured(idle_stop_s=1800.0, max_runtime_s=7200.0, max_cost_usd=150.0, env={})
    assert (s.idle_stop_s, s.max_runtime_s, s.max_cost_usd, s.interval_s) == (1800.0, 7200.0, 150.0, 10.0)
    assert GuardSettings.configured(**OFF, env={}) == GuardSettings()  # no guard given: all off


def test_the_job_configuration_hands_the_guards_typed_settings(tmp_path):
    """job/configure.py composes the guards' own settings from the typed options (no getattr on an object)."""

    settings = configure(["true"], JobOptions(idle_stop=60.0, max_runtime=7200.0), PreflightOptions())
    assert settings.guards == GuardSettings(60.0, 7200.0, None)
    assert configure(["true"], JobOptions(), PreflightOptions()).guards is None


@pytest.mark.parametrize(
    ("idle", "runtime", "cost", "active", "after_job"),
    [
        (None, None, None, False, False),
        (60.0, None, None, True, True),
        (None, 60.0, None, True, False),  # the job's runtime ends with the job
        (None, None, 0.5, True, True),
        (60.0, 60.0, 0.5, True, True),
    ],
)
def test_which_guards_are_on_and_which_watch_after_the_job(idle, runtime, cost, active, after_job):
    s = GuardSettings(idle, runtime, cost)
    assert (s.active, s.after_job) == (active, after_job)


@pytest.mark.parametrize(("raw", "seconds"), [("0.25", 0.25), (" 2 ", 2.0), ("", 10.0), ("   ", 10.0), ("1e-3", 0.001)])
def test_the_interval_variable(raw, seconds):
    assert GuardSettings.configured(**OFF, env={ENV_INTERVAL: raw}).interval_s == seconds


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "inf", "nan", "-inf", "1e999"])
def test_a_bad_interval_is_64_naming_it(raw):
    with pytest.raises(UsageError) as info:
        GuardSettings.configured(**OFF, env={ENV_INTERVAL: raw})
    assert info.value.code == ExitCode.USAGE
    assert info.value.message == f"{ENV_INTERVAL}={raw.strip()!r} is not valid; expected seconds > 0, e.g. 10"


def test_the_process_environment_is_read_when_none_is_given(monkeypatch):
    monkeypatch.setenv(ENV_INTERVAL, "0.5")
    assert GuardSettings.configured(**OFF).interval_s == 0.5
    monkeypatch.setenv("RUNPOD_POD_ID", "pod1")
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    check_guards(GuardSettings(max_cost_usd=5.0))  # the process's own pod id and key
    monkeypatch.delenv("RUNPOD_POD_ID")
    with pytest.raises(UsageError, match="--max-cost needs RUNPOD_POD_ID"):
        check_guards(GuardSettings(max_cost_usd=5.0))


def no_key_home(tmp_path, monkeypatch) -> None:
    """No key anywhere: not in the environment, no ~/.runpod/config.toml."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)


def test_max_cost_needs_this_pods_id(tmp_path, monkeypatch):
    no_key_home(tmp_path, monkeypatch)
    for env in ({}, {"RUNPOD_POD_ID": "  ", "RUNPOD_API_KEY": KEY}):
        with pytest.raises(UsageError) as info:
            check_guards(GuardSettings(max_cost_usd=0.5), env)
        assert info.value.message == (
            "--max-cost needs RUNPOD_POD_ID (RunPod sets it inside a pod) and an API key; outside a pod use "
            "--max-runtime"
        )


def test_max_cost_in_a_pod_without_a_key_is_64_naming_the_key(tmp_path, monkeypatch):
    no_key_home(tmp_path, monkeypatch)
    with pytest.raises(UsageError) as info:
        check_guards(GuardSettings(max_cost_usd=0.5), {"RUNPOD_POD_ID": "pod1"})
    assert info.value.code == ExitCode.USAGE
    assert info.value.message.startswith("--max-cost needs the RunPod API key: no RunPod API key")
    check_guards(GuardSettings(max_cost_usd=0.5), {"RUNPOD_POD_ID": "pod1", "RUNPOD_API_KEY": KEY})  # with one: ok


def test_the_other_guards_need_neither_pod_nor_key(tmp_path, monkeypatch):
    no_key_home(tmp_path, monkeypatch)
    check_guards(GuardSettings(idle_stop_s=60.0, max_runtime_s=60.0), {})
    check_guards(GuardSettings(), {})

"""durations.py: durations and dollar amounts as users write them, and durations as a person reads them (the common
cases: tests/guards/test_guard_rules.py)."""

from __future__ import annotations

import pytest

from podguard.durations import format_duration, parse_duration, parse_usd
from podguard.errors import UsageError

# what a user reads after a bad value (also in --help): spelled out here, so that a changed text is noticed
DURATION_HELP = "e.g. 90s, 30m, 2h, 1d or plain seconds; 0 or off disables"
USD_HELP = "US dollars such as 150 or 12.5; 0 or off disables"


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("1", 1.0),
        ("1s", 1.0),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("2d", 172800.0),
        ("1.", 1.0),
        (".5m", 30.0),
        ("10 m", 600.0),
        ("\t3M\n", 180.0),
        (2, 2.0),
        (1.5, 1.5),
    ],
)
def test_each_unit(raw, seconds):
    assert parse_duration(raw, "--idle-stop") == seconds


@pytest.mark.parametrize("raw", ["0s", "0m", "0.0h", "00", " off ", "Off", "   ", 0, 0.0])
def test_durations_that_disable(raw):
    assert parse_duration(raw, "--idle-stop") is None


@pytest.mark.parametrize("raw", [True, False])
def test_a_bool_is_not_a_duration(raw):
    with pytest.raises(UsageError, match=f"^--idle-stop={raw!r} is not a duration; expected "):
        parse_duration(raw, "--idle-stop")


@pytest.mark.parametrize("raw", ["1" + "0" * 400, "1" + "0" * 304 + "d"])
def test_a_duration_too_large_for_a_float_says_so(raw):
    with pytest.raises(UsageError) as info:
        parse_duration(raw, "--max-runtime")
    assert info.value.message == f"--max-runtime={raw!r} is too large; expected {DURATION_HELP}"


@pytest.mark.parametrize("raw", ["1ms", "m", "1 h 2", "1,5h", "+1h", "1w", "1h\n2"])
def test_bad_duration_shapes(raw):
    with pytest.raises(UsageError, match="is not a duration"):
        parse_duration(raw, "--idle-stop")


@pytest.mark.parametrize(
    ("raw", "usd"),
    [
        ("0.5", 0.5),
        ("$0.5", 0.5),
        (0.25, 0.25),
        (" $5 ", 5.0),
        ("1e3", 1000.0),
        ("$1.", 1.0),
    ],
)
def test_amounts_below_one_dollar_and_other_shapes(raw, usd):
    assert parse_usd(raw, "--max-cost") == usd


@pytest.mark.parametrize("raw", ["$0", "0.0", "0.00", "-0", 0, 0.0, " ", " OFF ", "Off"])
def test_amounts_that_disable(raw):
    assert parse_usd(raw, "--max-cost") is None


@pytest.mark.parametrize("raw", ["-0.5", "$-1", "1e400", "$", "5$", "$$5", False, "$inf", "-inf"])
def test_bad_amounts_name_the_value_and_what_is_valid(raw):
    with pytest.raises(UsageError) as info:
        parse_usd(raw, "--max-cost")
    assert info.value.message == f"--max-cost={raw!r} is not an amount; expected {USD_HELP}"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0, "0s"),
        (-5, "0s"),
        (-3600, "0s"),
        (9.5, "9.5s"),
        (10, "10s"),
        (10.4, "10s"),
        (12.3, "12s"),
        (59, "59s"),
        (60, "1m"),
        (60.4, "1m"),
        (61, "1m1s"),
        (119.6, "2m"),
        (3599, "59m59s"),
        (3600, "1h"),
        (3661, "1h1m"),  # three units: the seconds are dropped
        (7325, "2h2m"),
        (86400, "1d"),
        (86399, "23h59m"),
        (90061, "1d1h"),  # four units: two shown
        (86460, "1d"),  # 1d0h1m: the unit after days is hours, and it is zero
        (172800 + 59, "2d"),
        (3600 * 24 * 400, "400d"),
    ],
)
def test_format_duration_two_units_at_most(seconds, text):
    assert format_duration(seconds) == text

"""Durations and dollar amounts as users write them (the billing guards, `[limits]`), and their rendering.

    parse_duration("30m", "--idle-stop")     # 1800.0; "0" / "off" -> None (disabled)
    parse_usd("150", "--max-cost")           # 150.0;  "0" / "off" -> None
    format_duration(5400)                    # "1h30m"

A bad value is a UsageError (exit 64) naming the value and what is valid.
"""

from __future__ import annotations

import math
import re
from typing import Any

from podguard.errors import UsageError

__all__ = ["DURATION_HELP", "USD_HELP", "format_duration", "parse_duration", "parse_usd"]

DURATION_HELP = "e.g. 90s, 30m, 2h, 1d or plain seconds; 0 or off disables"
USD_HELP = "US dollars such as 150 or 12.5; 0 or off disables"
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)$")
_OFF = ("0", "off")


def parse_duration(raw: Any, name: str) -> float | None:
    """Seconds > 0, or None when `raw` is empty, 0 or off."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise UsageError(f"{name}={raw!r} is not a duration; expected {DURATION_HELP}")
    text = str(raw).strip().lower()
    if not text or text in _OFF:
        return None
    m = _DURATION.match(text)
    if m is None:
        raise UsageError(f"{name}={raw!r} is not a duration; expected {DURATION_HELP}")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(value):
        raise UsageError(f"{name}={raw!r} is too large; expected {DURATION_HELP}")
    return value or None


def parse_usd(raw: Any, name: str) -> float | None:
    """US dollars > 0 (`150`, `12.5`, `$150`), or None when `raw` is empty, 0 or off."""
    if raw is None:
        return None
    text = "" if isinstance(raw, bool) else str(raw).strip().lower()
    if not isinstance(raw, bool) and (not text or text in _OFF):
        return None
    try:
        value = float(text.removeprefix("$"))
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise UsageError(f"{name}={raw!r} is not an amount; expected {USD_HELP}")
    return value or None


def format_duration(seconds: float) -> str:
    """`42s`, `5m10s`, `1h30m`, `2d3h`: two units at most, for a person."""
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.0f}s" if s >= 10 or s == int(s) else f"{s:.1f}s"
    total = round(s)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (v, _) in enumerate(parts) if v)
    return "".join(f"{v}{u}" for v, u in parts[first : first + 2] if v)

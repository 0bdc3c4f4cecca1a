"""A spec's `[limits]` table: the billing guards and the run's watch as the `PODGUARD_*` variables the pod's
podguard reads.

    env = limits_env({"idle_stop": "30m", "max_cost_usd": 150}, spec_env, where="runpod/pod.toml")
    # {"PODGUARD_IDLE_STOP": "30m", "PODGUARD_MAX_COST": "150"}

Every value is checked with the parser the pod uses (guards, durations.py, `--restarts`), so a bad one is exit
64 on the laptop with no request sent, never a pod that starts and then refuses its own arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from podguard.durations import DURATION_HELP, USD_HELP, parse_duration, parse_usd
from podguard.errors import UsageError

RESTARTS_HELP = "a whole number of relaunches, 0 or more"


def _parse_restarts(raw: Any, name: str) -> float | None:
    """`[limits] restarts`: what `--restarts` takes (a TOML integer, or its text)."""
    text = str(raw).strip()
    if isinstance(raw, float) or not text.isdigit():
        raise UsageError(f"{name}={raw!r} is not valid; expected {RESTARTS_HELP}")
    return float(text)


__all__ = ["GUARD_KEYS", "LIMIT_KEYS", "limits_env"]

# key in [limits] -> (variable on the pod, parser of its value, what is valid)
LIMIT_KEYS: dict[str, tuple[str, Callable[[Any, str], float | None], str]] = {
    "idle_stop": ("PODGUARD_IDLE_STOP", parse_duration, DURATION_HELP),
    "max_runtime": ("PODGUARD_MAX_RUNTIME", parse_duration, DURATION_HELP),
    "max_cost_usd": ("PODGUARD_MAX_COST", parse_usd, USD_HELP),
    "hang_timeout": ("PODGUARD_HANG_TIMEOUT", parse_duration, DURATION_HELP),  # no progress this long: hung (79)
    "restarts": ("PODGUARD_RESTARTS", _parse_restarts, RESTARTS_HELP),  # relaunches after a crash, hang or fault
}
GUARD_KEYS = ("idle_stop", "max_runtime", "max_cost_usd")  # the billing guards among them


def limits_env(limits: Mapping[str, Any], env: Mapping[str, str], *, where: str) -> dict[str, str]:
    """The variables for `limits` (already checked for unknown keys); UsageError on a bad value or when
    `[env]` sets the same variable."""
    out: dict[str, str] = {}
    for key, value in limits.items():
        variable, parse, valid = LIMIT_KEYS[key]
        name = f"{where}: [limits] {key}"
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise UsageError(valid)
            parse(value, name)
        except UsageError:
            raise UsageError(f"{name} = {value!r} is not valid; expected {valid}") from None
        if variable in env:
            raise UsageError(f"{name} and [env] {variable} set the same setting; keep one")
        out[variable] = str(value).strip()
    return out

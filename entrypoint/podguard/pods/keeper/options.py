"""`pod keep`'s options, checked before any request (64 naming the value and what is valid).

    options = keep_options(poll=30, max_recoveries=5)      # plus the tuning knobs from the environment

The knobs below are for tests and tuning, not user options: PODGUARD_KEEP_SILENCE_S (the 15-minute silence
that marks a lost host), PODGUARD_KEEP_SETTLE_S, PODGUARD_KEEP_RECOVERY_POLL_S, PODGUARD_KEEP_CAPACITY_WAIT_S
PODGUARD_KEEP_CAPACITY_WAIT_CAP_S, PODGUARD_KEEP_PARK_S, PODGUARD_KEEP_NOTIFY_S, PODGUARD_KEEP_CONFIRM_S (how long an
action is read back) and PODGUARD_KEEP_LAND_S (how long a create may still land after its answer's deadline; `pod
down` waits for it) (see docs/running-pods.md).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podguard.errors import UsageError

__all__ = ["KNOBS", "KeepOptions", "check_key_secret", "keep_options"]


@dataclass(frozen=True)
class KeepOptions:
    poll_s: float = 30.0  # one status request per poll
    max_recoveries: int = 5
    silence_s: float = 900.0  # RUNNING, no runtime, no log line this long: the host is lost
    settle_s: float = 3.0  # before acting on a status alone: read what is still in flight on the stream
    recovery_poll_s: float = 5.0  # while a recovered pod comes up: polls at most this far apart
    capacity_wait_s: float = 30.0  # the first wait for capacity; doubles up to the cap
    capacity_wait_cap_s: float = 600.0
    park_s: float = 600.0  # a keeper pod that can neither go on nor stop itself waits this long before exiting
    notify_s: float = 5.0  # the deadline of one `--notify` message, all its tries together
    confirm_s: float = 60.0  # an action counts once the pod reads back so: read again for up to this long
    land_s: float = 30.0  # after its answer's deadline, how long a create (start) may still land (`pod down` waits)


KNOBS = {
    "silence_s": "PODGUARD_KEEP_SILENCE_S",
    "settle_s": "PODGUARD_KEEP_SETTLE_S",
    "recovery_poll_s": "PODGUARD_KEEP_RECOVERY_POLL_S",
    "capacity_wait_s": "PODGUARD_KEEP_CAPACITY_WAIT_S",
    "capacity_wait_cap_s": "PODGUARD_KEEP_CAPACITY_WAIT_CAP_S",
    "park_s": "PODGUARD_KEEP_PARK_S",
    "notify_s": "PODGUARD_KEEP_NOTIFY_S",
    "confirm_s": "PODGUARD_KEEP_CONFIRM_S",
    "land_s": "PODGUARD_KEEP_LAND_S",
}
_SECRET_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def keep_options(*, poll: float | str, max_recoveries: int | str, env: Mapping[str, str] | None = None) -> KeepOptions:
    """The options (as given: numbers, or the text of a flag or a PODGUARD_* variable) and the knobs; 64 if bad."""
    env = os.environ if env is None else env
    poll_s = _number(poll, "--poll", "seconds > 0 (default 30)", float)
    if not (math.isfinite(poll_s) and poll_s > 0):
        raise UsageError(f"--poll {str(poll).strip()} is not valid; expected seconds > 0 (default 30)")
    recoveries = _number(max_recoveries, "--max-recoveries", "a whole number >= 0 (default 5)", int)
    if recoveries < 0:
        raise UsageError(f"--max-recoveries {recoveries} is not valid; expected a whole number >= 0 (default 5)")
    knobs: dict[str, float] = {}
    for field, variable in KNOBS.items():
        raw = env.get(variable, "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{variable}={raw!r} is not valid; expected seconds > 0") from None
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{variable}={raw} is not valid; expected seconds > 0")
        knobs[field] = value
    return KeepOptions(poll_s=poll_s, max_recoveries=recoveries, **knobs)


def _number(value: object, option: str, valid: str, kind: type[int] | type[float]) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return kind(value)
    try:
        return kind(str(value).strip())
    except ValueError:
        raise UsageError(f"{option} {str(value).strip()!r} is not valid; expected {valid}") from None


def check_key_secret(name: str) -> str:
    """A RunPod secret's name: letters, digits, `_` and `-` (the keeper pod's key is `{{ RUNPOD_SECRET_<name> }}`)."""
    if not _SECRET_NAME.match(name):
        raise UsageError(
            f"--key-secret {name!r} is not valid; expected the name of a RunPod secret (letters, digits, _ and -, "
            "at most 64), e.g. runpod_api_key"
        )
    return name

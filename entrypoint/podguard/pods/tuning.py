"""Timing knobs of the pod commands, with defaults for RunPod and environment overrides for tests.

    tuning = Tuning.from_env()     # PODGUARD_POD_POLL_S=0.05 etc. make the stand-in tests fast

None of these are user-facing options; `--timeout` and `--retry-for` are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from podguard.errors import UsageError

__all__ = ["TUNING_ENV", "Tuning"]

_ENV = {
    "poll_s": "PODGUARD_POD_POLL_S",
    "settle_s": "PODGUARD_POD_SETTLE_S",
    "backoff_s": "PODGUARD_API_BACKOFF_S",
    "backoff_cap_s": "PODGUARD_API_BACKOFF_CAP_S",
    "request_timeout_s": "PODGUARD_API_TIMEOUT_S",
    "stream_idle_s": "PODGUARD_POD_STREAM_IDLE_S",
    "logs_idle_s": "PODGUARD_POD_LOGS_IDLE_S",
    "restart_wait_s": "PODGUARD_SELF_HEAL_RESTART_WAIT_S",
    "restart_confirm_s": "PODGUARD_POD_RESTART_CONFIRM_S",
}
TUNING_ENV = _ENV  # field -> variable


@dataclass(frozen=True)
class Tuning:
    """Seconds. Defaults keep a waiting `pod up` at about 13 requests a minute."""

    poll_s: float = 5.0  # status checks while a pod provisions, and beside the log stream
    settle_s: float = 0.3  # after a verdict line: a newer one in the same burst wins
    backoff_s: float = 0.5  # first retry delay; doubles per attempt, full jitter
    backoff_cap_s: float = 8.0
    request_timeout_s: float = 30.0  # one HTTP request (connect + answer)
    stream_idle_s: float = 120.0  # a silent log stream is reopened (from its last event) after this
    logs_idle_s: float = 0.75  # `pod logs` without --follow ends once the backfill went quiet this long
    restart_wait_s: float = 120.0  # self-heal: how long the container waits for its restart to end it
    restart_confirm_s: float = 120.0  # heal: a restart whose pod shows no new start by then did nothing

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tuning:
        env = os.environ if env is None else env
        values: dict[str, float] = {}
        for f in fields(cls):
            raw = env.get(_ENV[f.name], "").strip()
            if not raw:
                continue
            try:
                value = float(raw)
            except ValueError:
                raise UsageError(f"{_ENV[f.name]}={raw!r} is not a number of seconds") from None
            if not (0 < value < float("inf")):
                raise UsageError(f"{_ENV[f.name]}={raw} is not valid; expected seconds > 0")
            values[f.name] = value
        return cls(**values)

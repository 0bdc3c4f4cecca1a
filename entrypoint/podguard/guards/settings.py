"""The guard settings as the options gave them, and the checks that run before anything starts.

    settings = GuardSettings.configured(idle_stop_s=600, max_runtime_s=None, max_cost_usd=None)
    check_guards(settings)          # --max-cost outside a pod / without a key: 64

Both run in job/configure.py, before anything starts; PODGUARD_GUARD_INTERVAL is read in `configured`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from podguard.errors import UsageError
from podguard.pods.thispod.key import require_pod_and_key

__all__ = ["DEFAULT_INTERVAL_S", "ENV_INTERVAL", "IDLE_UTILIZATION_PCT", "GuardSettings", "check_guards"]

IDLE_UTILIZATION_PCT = 5  # a GPU at or below this utilisation counts as idle
DEFAULT_INTERVAL_S = 10.0  # how often the idle guard samples the GPUs (one NVML call per GPU)
ENV_INTERVAL = "PODGUARD_GUARD_INTERVAL"  # tests shorten it; not a user-facing option


@dataclass(frozen=True)
class GuardSettings:
    """Seconds and US dollars; None = that guard is off."""

    idle_stop_s: float | None = None
    max_runtime_s: float | None = None
    max_cost_usd: float | None = None
    interval_s: float = DEFAULT_INTERVAL_S

    @classmethod
    def configured(
        cls,
        *,
        idle_stop_s: float | None,
        max_runtime_s: float | None,
        max_cost_usd: float | None,
        env: Mapping[str, str] | None = None,
    ) -> GuardSettings:
        """From `--idle-stop`, `--max-runtime`, `--max-cost` (None: off) and PODGUARD_GUARD_INTERVAL (64 when it
        is not valid)."""
        env = os.environ if env is None else env
        raw = env.get(ENV_INTERVAL, "").strip()
        interval = DEFAULT_INTERVAL_S
        if raw:
            try:
                interval = float(raw)
            except ValueError:
                interval = math.nan  # (fails the check below, as nan and inf themselves do)
            if not (0 < interval < math.inf):
                raise UsageError(f"{ENV_INTERVAL}={raw!r} is not valid; expected seconds > 0, e.g. 10")
        return cls(idle_stop_s, max_runtime_s, max_cost_usd, interval)

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.idle_stop_s, self.max_runtime_s, self.max_cost_usd))

    @property
    def after_job(self) -> bool:
        """Guards that keep watching after the job (`--on-exit idle`): idle and cost, not the job's runtime."""
        return self.idle_stop_s is not None or self.max_cost_usd is not None


def check_guards(settings: GuardSettings, env: Mapping[str, str] | None = None) -> None:
    """--max-cost needs this pod's id and an API key (its cost/hr comes from the API): UsageError if not."""
    if settings.max_cost_usd is None:
        return
    require_pod_and_key("--max-cost", hint=" and an API key; outside a pod use --max-runtime", env=env)

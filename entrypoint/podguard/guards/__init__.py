"""Billing guards: `--idle-stop`, `--max-runtime`, `--max-cost` enforced from inside the pod (docs/guards.md).

settings = job.guards                                  # job/configure.py: GuardSettings.configured, check_guards
guards = open_guards(settings)                          # reads the pod's cost/hr once (--max-cost)
run_job(specs, watch=guards.supervised(selection))      # sampled on the supervisor's loop
if guards.tripped: code = end_after_trip(guards.tripped) # stop this pod through the API, else 124
"""

from __future__ import annotations

from podguard.guards.settings import GuardSettings, check_guards
from podguard.guards.watch import GuardWatch, Trip, open_guards

__all__ = ["GuardSettings", "GuardWatch", "Trip", "check_guards", "open_guards"]

"""This pod, seen from inside it: who it is, whether podguard may act on it, what it costs, how its billing ends.

    from podguard.pods import thispod
    thispod.pod_id()                              # RUNPOD_POD_ID ("" outside a RunPod pod)

    from podguard.pods.thispod.key import in_pod_with_key, require_pod_and_key
    in_pod_with_key()                             # the pod's id when inside a pod with an API key, else None
    require_pod_and_key("--max-cost", hint="; outside a pod use --max-runtime")   # UsageError (64) if not

    from podguard.pods.thispod.meter import read_budget, read_price      # its price and spend (one GET)
    from podguard.pods.thispod.billing import end_billing                # stop it, or delete its cluster, then wait

The one place that reads `RUNPOD_POD_ID`, for the guards, the metrics, self-heal, the keeper and the CLI. This
module itself is the standard library only: the CLI, the launch and the preflight read the pod's id from here on
every run; the key, the meter and the billing are submodules, loaded by what acts on the pod.
Ending the billing (a pod is stopped; a member of an Instant Cluster deletes its cluster): docs/guards.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["ENV_POD_ID", "pod_id"]

ENV_POD_ID = "RUNPOD_POD_ID"  # RunPod sets it in every pod's container


def pod_id(env: Mapping[str, str] | None = None) -> str:
    """This pod's id, or "" outside a RunPod pod."""
    env = os.environ if env is None else env
    return env.get(ENV_POD_ID, "").strip()

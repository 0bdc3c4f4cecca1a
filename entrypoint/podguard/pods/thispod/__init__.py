"""This pod, seen from inside it: who it is, whether podguard may act on it, what it costs, how its billing ends.

    from podguard.pods import thispod
    thispod.pod_id()                              # RUNPOD_POD_ID ("" outside a RunPod pod)
    thispod.in_pod_with_key()                     # the pod's id when inside a pod with an API key, else None
    thispod.require_pod_and_key("--max-cost", hint="; outside a pod use --max-runtime")   # UsageError (64) if not

    from podguard.pods.thispod.meter import read_budget, read_price      # its price and spend (one GET)
    from podguard.pods.thispod.billing import end_billing                # stop it, or delete its cluster, then wait

The one place that reads `RUNPOD_POD_ID`, for the guards, the metrics, self-heal, the keeper and the CLI. This
module itself is light (no HTTP client): the launch and the preflight read the pod's id from here on every run.
Ending the billing (a pod is stopped; a member of an Instant Cluster deletes its cluster): docs/guards.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from podguard.errors import PodguardError, UsageError
from podguard.pods.auth import load_api_key

__all__ = ["ENV_POD_ID", "in_pod_with_key", "pod_id", "require_pod_and_key"]

ENV_POD_ID = "RUNPOD_POD_ID"  # RunPod sets it in every pod's container


def pod_id(env: Mapping[str, str] | None = None) -> str:
    """This pod's id, or "" outside a RunPod pod."""
    env = os.environ if env is None else env
    return env.get(ENV_POD_ID, "").strip()


def in_pod_with_key(env: Mapping[str, str] | None = None) -> str | None:
    """This pod's id when podguard may act on it through the API (inside a pod, with a key); else None."""
    own = pod_id(env)
    if not own:
        return None
    try:
        load_api_key(env)
    except PodguardError:
        return None
    return own


def require_pod_and_key(option: str, *, hint: str, env: Mapping[str, str] | None = None) -> str:
    """This pod's id for an option that acts on it through the API (`--max-cost`, `--on-exit=stop-pod`); UsageError
    (64) naming what is missing when outside a pod or without a key. `hint` ends the outside-a-pod line."""
    own = pod_id(env)
    if not own:
        raise UsageError(f"{option} needs {ENV_POD_ID} (RunPod sets it inside a pod){hint}")
    try:
        load_api_key(env)
    except PodguardError as exc:
        raise UsageError(f"{option} needs the RunPod API key: {exc.message}") from None
    return own

"""Whether podguard may act on this pod through the API: inside a RunPod pod, with an API key.

pod_id = in_pod_with_key()                    # this pod's id, or None (outside a pod, or no key)
require_pod_and_key("--on-exit=stop-pod", hint="; use exit or idle")   # UsageError (64) naming what is missing
"""

from __future__ import annotations

from collections.abc import Mapping

from podguard.errors import PodguardError, UsageError
from podguard.pods.auth import load_api_key
from podguard.pods.thispod import ENV_POD_ID, pod_id

__all__ = ["in_pod_with_key", "require_pod_and_key"]


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

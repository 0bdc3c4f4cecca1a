"""stop / start / restart / down as idempotent operations with one-line refusals.

    result = apply_action(api, "llm-train", PodAction.STOP)   # an EXITED pod: success, no request sent

Already in the wanted state is success; an action the pod's status does not allow is a UsageError (64)
that names the allowed actions (also when RunPod answers 409 because the status changed under us).
`down` of a pod that is already gone is success.
"""

from __future__ import annotations

from dataclasses import dataclass

from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.placement import find_pod
from podguard.pods.pod import Pod, PodAction, PodStatus, allowed_actions

__all__ = ["ActionResult", "act_on", "apply_action"]

# Statuses in which the action has nothing left to do.
_DONE = {
    PodAction.STOP: (PodStatus.EXITED,),
    PodAction.START: (PodStatus.RUNNING, PodStatus.STARTING, PodStatus.PROVISIONING),
    PodAction.TERMINATE: (PodStatus.TERMINATED,),
}


@dataclass(frozen=True)
class ActionResult:
    pod: Pod | None  # None: terminated (or was already gone)
    changed: bool
    message: str


def apply_action(api: PodApi, ref: str, action: PodAction) -> ActionResult:
    """Find the pod by name or id and apply `action` idempotently."""
    pod = find_pod(api, ref, missing_ok=action is PodAction.TERMINATE)
    if pod is None:
        return ActionResult(None, False, f"no pod named {ref!r} or with that id: nothing to take down")
    return act_on(api, pod, action)


def act_on(api: PodApi, pod: Pod, action: PodAction) -> ActionResult:
    if pod.status in _DONE.get(action, ()):
        return ActionResult(pod, False, f"pod {pod.name} ({pod.id}) is already {pod.status}")
    allowed = pod.actions or allowed_actions(pod.status)
    if action not in allowed:
        raise _refusal(pod, action)
    try:
        updated = api.act(pod.id, action)
    except ApiError as exc:
        if exc.kind is ApiErrorKind.NOT_FOUND and action is PodAction.TERMINATE:
            return ActionResult(None, False, f"pod {pod.name} ({pod.id}) is already gone")
        if exc.kind is ApiErrorKind.NO_CAPACITY and action is PodAction.START:
            hint = f"a stopped pod is pinned to its host; `podguard pod heal {pod.name} --replace` moves it"
            raise ApiError(exc.kind, f"{exc.message}\n  {hint}", status=exc.status, detail=exc.detail) from None
        if exc.kind is not ApiErrorKind.CONFLICT:
            raise
        fresh = api.get_pod(pod.id)
        if fresh.status in _DONE.get(action, ()):
            return ActionResult(fresh, False, f"pod {fresh.name} ({fresh.id}) is already {fresh.status}")
        raise _refusal(fresh, action) from None
    verb = {PodAction.STOP: "stopping", PodAction.START: "starting", PodAction.RESTART: "restarting"}
    if action is PodAction.TERMINATE:
        return ActionResult(None, True, f"pod {pod.name} ({pod.id}) terminated")
    shown = updated or pod
    return ActionResult(shown, True, f"pod {pod.name} ({pod.id}): {verb[action]} (now {shown.status})")


def _refusal(pod: Pod, action: PodAction) -> UsageError:
    allowed = pod.actions or allowed_actions(pod.status)
    names = ", ".join(str(a).replace("terminate", "down") for a in allowed) or "none"
    return UsageError(f"pod {pod.name} ({pod.id}) is {pod.status}: {_verb(action)} is not allowed; allowed: {names}")


def _verb(action: PodAction) -> str:
    return "down" if action is PodAction.TERMINATE else str(action)

"""Ending this pod's billing from inside it, one way for every caller (a billing guard, `--on-exit stop-pod`,
self-heal's `PODGUARD_PARK=stop`), then waiting for the signal with which RunPod ends this container.

    ended = end_billing(pod_id, "job succeeded", by="--on-exit stop-pod")
    ended.asked       # "stop", "cluster delete", or None when the request failed (one warning line said)
    ended.signal      # the signal RunPod's answer sent (SIGTERM), or None when none came in time

- a pod is stopped (`POST /v2/pods/{id}/action {"action": "stop"}`; already stopped is success);
- a member of an Instant Cluster (the API shows the pod with `cluster {id, rank, ip}`) cannot be stopped (409) and
  a cluster has no stop, so the whole cluster is deleted (`DELETE /v2/clusters/{id}`; network volumes stay; already
  gone is success). Why the API and not the cluster variables decide: docs/guards.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from podguard import console
from podguard.errors import PodguardError
from podguard.pause import next_signal, signals_held
from podguard.pods.actions import act_on
from podguard.pods.api import PodApi, open_api
from podguard.pods.clusters.rest import cluster_api
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.pod import Pod, PodAction
from podguard.pods.tuning import Tuning

__all__ = ["Ended", "end_billing", "request_end"]


@dataclass(frozen=True)
class Ended:
    """What `end_billing` asked and what came of it."""

    pod_id: str
    asked: str | None  # "stop", "cluster delete" or "left to node 0"; None when it could not be asked (a warning)
    signal: int | None = None  # the signal that ended the wait, or None
    cluster_id: str | None = None  # this pod is a member of this Instant Cluster (when the API could be read)


def end_billing(pod_id: str, why: str, *, by: str | None = None, node_zero_only: bool = False) -> Ended:
    """Ask the API to end this pod's billing, then wait (PODGUARD_SELF_HEAL_RESTART_WAIT_S, default 120 s) for the
    signal with which RunPod ends this container. Signals are held from before the request, so a SIGTERM that
    follows it at once is neither lost nor kills podguard mid-line. `why` starts the one line said; `by` (the
    option that asked) ends it. A failed request is one warning line; the caller says what follows."""
    wait_s = Tuning.from_env().restart_wait_s
    with signals_held() as watched:
        ended = request_end(pod_id, why, by=by, node_zero_only=node_zero_only)
        if ended.asked is None:
            return ended
        return Ended(pod_id, ended.asked, next_signal(watched, wait_s), ended.cluster_id)


def request_end(pod_id: str, why: str, *, by: str | None = None, node_zero_only: bool = False) -> Ended:
    """The request alone (no wait): read this pod, then stop it or delete its cluster, saying so in one line.
    `node_zero_only` (a job's own end, not a guard): on a cluster node other than node 0 nothing is asked; node 0
    deletes the cluster when its own job ends, so a node that finishes first never cuts the others' last steps
    (node 0 commits a multi-node checkpoint to the store only once every node's files are in)."""
    pod: Pod | None = None
    try:
        api = open_api("rest")
        pod = api.get_pod(pod_id)
        if node_zero_only and pod.cluster_id is not None and pod.cluster_rank not in (None, 0):
            console.say(
                f"{why}: this pod ({pod.id}) is node{pod.cluster_rank} of Instant Cluster {pod.cluster_id}: node 0 "
                f"deletes the cluster when its own job ends; waiting for it" + (f" ({by})" if by else ""),
                loud=True,
            )
            return Ended(pod_id, "left to node 0", None, pod.cluster_id)
        if pod.cluster_id is None:
            _stop_pod(api, pod, why, by)
        else:
            _delete_cluster(api, pod, why, by)
    except PodguardError as exc:
        if pod is not None and pod.cluster_id is not None:
            cid = pod.cluster_id
            console.warn(f"could not delete cluster {cid} (pod {pod_id} is its node): {exc.message}")
            return Ended(pod_id, None, None, cid)
        console.warn(f"could not stop pod {pod_id}: {exc.message}")
        return Ended(pod_id, None)
    return Ended(pod_id, "stop" if pod.cluster_id is None else "cluster delete", None, pod.cluster_id)


def _stop_pod(api: PodApi, pod: Pod, why: str, by: str | None) -> None:
    act_on(api, pod, PodAction.STOP)  # already stopped is success
    console.say(f"{why}: stopping pod {pod.id} ({by or 'billing ends'})", loud=True)


def _delete_cluster(api: PodApi, pod: Pod, why: str, by: str | None) -> None:
    """One line: why, what is deleted and why (already gone is success: another node's guard, or a retry of this
    delete whose first answer was lost)."""
    cid = pod.cluster_id
    assert cid is not None
    node = f"node{pod.cluster_rank}" if pod.cluster_rank is not None else "a node"
    done = "deleting"
    try:
        cluster_api(api).delete_cluster(cid)
    except ApiError as exc:
        if exc.kind is not ApiErrorKind.NOT_FOUND:
            raise
        done = "already deleted (by another node's guard, or this request's own retry after a lost answer):"
    console.say(
        f"{why}: this pod ({pod.id}) is {node} of Instant Cluster {cid}, whose pods cannot be stopped: {done} "
        "the whole cluster, all its nodes (network volumes stay; billing ends)" + (f" ({by})" if by else ""),
        loud=True,
    )

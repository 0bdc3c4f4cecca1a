"""The keeper's hands: every create, start, stop and terminate fenced by the user's word and read back.

    hands = Actuator(api, fence, tuning, confirm_s=60)
    pod = hands.start(pod)              # fence, lease, start, then read back until it boots (None: not confirmed)
    hands.stop(pod_id)                  # True once it reads back EXITED (or gone)
    hands.terminate(pod_id)             # True once it reads back gone
    hands.delete_cluster(ClusterTarget(clusters), cid)   # True once it reads back 404 (pods/target.deleted)
    pod = hands.create(PodTarget(api), candidates, owned_named)   # fenced and leased; a lost answer looked up

An action counts only once the pod reads back in its new state, read every `tuning.poll_s` for up to `confirm_s`
and sent once more half-way (a stop answered 200 but not carried out is made again). A 409 is no reason to end: the
pod is read again and the action is done, moot, or left for the next poll. A status the keeper does not know reads
as "not yet". Creates and starts hold SIGTERM while their request is in flight (interrupt.held) and take a lease
first (fence.lease): `pod down` waits for what they may still make.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from podguard.pods.api import PodApi
from podguard.pods.clusters.target import ClusterTarget
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.fence import Fence
from podguard.pods.keeper.intent_store import rest_of
from podguard.pods.keeper.interrupt import held
from podguard.pods.placement import first_fit
from podguard.pods.pod import Pod, PodAction, PodStatus
from podguard.pods.retry import with_retry
from podguard.pods.target import Target, deleted
from podguard.pods.tuning import Tuning

__all__ = ["BOOTING", "Actuator"]

BOOTING = (PodStatus.PROVISIONING, PodStatus.STARTING, PodStatus.RUNNING)
T = TypeVar("T")
R = TypeVar("R")


class Actuator:
    def __init__(self, api: PodApi, fence: Fence, tuning: Tuning, *, confirm_s: float) -> None:
        self.api, self.fence, self.tuning, self.confirm_s = api, fence, tuning, confirm_s

    # -- reading back --------------------------------------------------------------------------------------
    def _read(self, pod_id: str) -> Pod | None:
        """The pod as the API shows it now; None when it is gone."""
        try:
            pod = with_retry(lambda: self.api.get_pod(pod_id), self.api.policy, what=f"read pod {pod_id} back")
        except ApiError as exc:
            if exc.kind is ApiErrorKind.NOT_FOUND:
                return None
            raise
        return None if pod.status is PodStatus.TERMINATED else pod

    def _until(
        self, pod_id: str, done: Callable[[Pod | None], bool], again: Callable[[], bool], refused: bool
    ) -> Pod | bool | None:
        """Read `pod_id` back until `done`; the pod read last (False: not confirmed within confirm_s). `again` sends
        the action once more (True when RunPod refused it with a 409: the pod was changing state): half-way, or at
        the next read while the last one was refused."""
        deadline = time.monotonic() + self.confirm_s
        resend = time.monotonic() + self.confirm_s / 2
        while True:
            pod = self._read(pod_id)
            if done(pod):
                return pod
            now = time.monotonic()
            if now >= deadline:
                return False
            if refused or (resend and now >= resend):
                resend = 0.0
                self.fence.check()
                refused = again()
            time.sleep(max(0.0, min(self.tuning.poll_s, deadline - time.monotonic())))

    def _send(self, pod_id: str, action: PodAction) -> bool:
        """One `action` on the pod, transient failures retried; True when RunPod refused it (409: read again)."""
        try:
            with_retry(lambda: self.api.act(pod_id, action), self.api.policy, what=f"{action} pod {pod_id}")
        except ApiError as exc:
            if exc.kind is ApiErrorKind.CONFLICT:
                return True
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise
        return False

    # -- the actions ---------------------------------------------------------------------------------------
    def start(self, pod: Pod) -> Pod | None:
        """Start `pod`; the pod once it reads back booting (a new start), None when it did not within confirm_s.
        ApiError NO_CAPACITY when its host has no free GPUs; NOT_FOUND when it is gone."""
        rest = rest_of(self.api)

        def attempt() -> bool:  # each try fenced and leased on its own: a try whose answer was lost may still land
            self.fence.check()
            try:
                self._leased(lambda: rest.act_once(pod.id, PodAction.START))
            except ApiError as exc:
                if exc.kind is ApiErrorKind.CONFLICT:
                    return True
                raise
            return False

        def send() -> bool:
            return with_retry(attempt, self.api.policy, what=f"start pod {pod.id}")

        refused = send()

        def booted(p: Pod | None) -> bool:
            if p is None:
                raise ApiError(ApiErrorKind.NOT_FOUND, f"pod {pod.id} is gone")
            return p.status in BOOTING  # it was EXITED or ERROR: booting again is the start's doing

        got = self._until(pod.id, booted, send, refused)
        return got if isinstance(got, Pod) else None

    def stop(self, pod_id: str) -> str:
        """Stop the pod: "stopped" once it reads back EXITED, "gone" when it is gone, "" when not confirmed."""
        self.fence.check()
        first = self._read(pod_id)
        if first is None or first.status is PodStatus.EXITED:
            return "gone" if first is None else "stopped"

        def send() -> bool:
            return self._send(pod_id, PodAction.STOP)

        refused = send()
        got = self._until(pod_id, lambda p: p is None or p.status is PodStatus.EXITED, send, refused)
        return "" if got is False else "gone" if got is None else "stopped"

    def terminate(self, pod_id: str) -> bool:
        """Terminate the pod: True once it reads back gone."""
        self.fence.check()

        def send() -> bool:
            return self._send(pod_id, PodAction.TERMINATE)

        refused = send()
        return self._until(pod_id, lambda p: p is None, send, refused) is not False

    def delete_cluster(self, target: ClusterTarget, cluster_id: str) -> bool:
        """Delete the cluster, the user's word read again before each send: True once it reads back gone (a
        cluster has no stop)."""
        return deleted(
            target, cluster_id, within_s=self.confirm_s, poll_s=self.tuning.poll_s, before_send=self.fence.check
        )

    def create(self, target: Target[T, R], candidates: Sequence[R], named: Callable[[str], list[T]]) -> T:
        """The spec's candidates in order (pods/placement.py's walk), a pod's or a cluster's (every node at once);
        each attempt fenced, leased and sent with SIGTERM held; `named` finds the keeper's own of the name (a lost
        answer is looked up, never sent twice)."""

        def once(request: R) -> T:
            self.fence.check()
            return self._leased(lambda: target.create(request))

        return first_fit(candidates, once, named, target.policy, kind=target.kind, none_fits=target.none_fits)

    def _leased(self, send: Callable[[], T]) -> T:
        """Send ONE create (start) attempt under a lease, SIGTERM held while it is in flight: an answer ends the
        lease; a lost one (a dropped connection, a timeout, a 5xx) leaves it, for `pod down` to wait on."""
        token = self.fence.lease(self.tuning.request_timeout_s)
        with held():
            try:
                got = send()
            except ApiError as exc:
                if exc.kind is not ApiErrorKind.TRANSIENT:  # answered (a refusal, a 429): nothing of it lands later
                    self.fence.release(token)
                raise
            self.fence.release(token)
            return got

"""What the keeper keeps: one pod, or one Instant Cluster, behind the same small interface.

    target = PodTarget(api, spec, tuning)        # or ClusterTarget(cluster_api(api), spec, tuning)
    action = target.up()                         # `pod up` without the wait: created | reused | started
    observed = target.poll(silent=set())         # ONE status request (a cluster: its aggregate)
    got = target.streams.get(timeout=1.0)        # (rank, LogEvent | ApiError) from one stream per node
    target.adopt(exclude=old_id)                 # the one of this name, whoever made it (look up before a create)
    target.create(say); target.settle_twins()    # a twin made at the same moment: the oldest of the name stays

Built on the layers `pod up` and `pod heal` use (pods/up.py, placement.py, actions.py, clusters/up.py,
placement.py, streams.py), not a copy of them. A replacement is "remove, then create from the spec": never two
pods (clusters) of one name at a time: the keeper looks the name up before every create and adopts what exists,
whoever made it; a create whose answer was lost is looked up by name (placement.py); and two creates at the same
moment (two keepers) are settled after the fact by one rule every keeper applies: the oldest of the name stays,
the newer ones are terminated (`settle_twins`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from podguard.pods.actions import act_on
from podguard.pods.api import PodApi
from podguard.pods.clusters.model import Cluster, ClusterRequest, Member
from podguard.pods.clusters.placement import clusters_named, create_cluster_first_fit
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.clusters.streams import NodeStreams
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.decide import NodeState, Observed
from podguard.pods.keeper.record import KeepState, NodeMark
from podguard.pods.keeper.twins import pick_one, settle
from podguard.pods.model import Pod, PodAction, PodRequest, PodStatus, allowed_actions
from podguard.pods.placement import create_first_fit, pods_named
from podguard.pods.progress import Progress
from podguard.pods.readiness import BACKFILL_WITHOUT_START
from podguard.pods.retry import with_retry
from podguard.pods.spec import PodSpec
from podguard.pods.tuning import Tuning

__all__ = ["ClusterTarget", "PodTarget", "Target"]

Say = Callable[[str], None]


class Target(Protocol):
    kind: str
    name: str
    streams: NodeStreams

    @property
    def target_id(self) -> str: ...

    def up(self, say: Say) -> str: ...

    def adopt(self, *, exclude: str = "", only: str = "", prefer: str = "") -> bool: ...

    def discard(self, target_id: str) -> None: ...

    def settle_twins(self) -> str: ...

    def poll(self, state: KeepState, silent: set[int], *, members: bool = False) -> Observed: ...

    def start(self) -> None: ...

    def remove(self) -> None: ...

    def create(self, say: Say, dc: str | None = None) -> None: ...

    def stream_lost(self, rank: int) -> None: ...

    def stop(self, *, why: str) -> str: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def _pinned(dc: str | None, candidates: list[PodRequest]) -> list[PodRequest]:
    """Candidates in the network volume's data centre (a volume lives in one), one per GPU type, in order."""
    if not dc:
        return candidates
    seen: set[object] = set()
    out: list[PodRequest] = []
    for c in candidates:
        key = (c.gpu, c.cpu)
        if key not in seen:
            seen.add(key)
            out.append(replace(c, data_center=dc))
    return out


class PodTarget:
    kind = "pod"

    def __init__(self, api: PodApi, spec: PodSpec, tuning: Tuning) -> None:
        self.api, self.spec, self.tuning = api, spec, tuning
        self.name = spec.name
        self.pod: Pod | None = None
        self.streams = NodeStreams(api, tuning)
        self._followed: tuple[str, str | None] | None = None  # (pod id, start) of the open stream
        self._not_started_at: str | None = None  # a start we asked for: follow only the newer one
        self._stale: str | None = None

    @property
    def target_id(self) -> str:
        return self.pod.id if self.pod is not None else ""

    def describe(self) -> str:
        return f"pod {self.name} ({self.target_id or 'none'})"

    def up(self, say: Say) -> str:
        from podguard.pods.up import pod_up

        quiet = Progress(quiet=True)
        result = pod_up(self.api, self.spec, timeout_s=0, wait=False, tuning=self.tuning, progress=quiet)
        self.pod = result.pod
        if result.action == "started":
            self._stale = self.pod.started_at
        return result.action

    def _named(self, exclude: str = "") -> list[Pod]:
        what = f"look up pod {self.name}"
        return with_retry(lambda: pods_named(self.api, self.name, exclude=(exclude,)), self.api.policy, what=what)

    def adopt(self, *, exclude: str = "", only: str = "", prefer: str = "") -> bool:
        """The pod of this name, whoever made it (`exclude`: not that one; `only`: that one; of several: `prefer`,
        else the oldest); False if none."""
        pod = pick_one(self._named(exclude), only=only, prefer=prefer)
        if pod is None:
            return False
        assert isinstance(pod, Pod)
        if self.pod is None or pod.id != self.pod.id:
            self.stream_lost(0)
            self._stale = None
        self.pod = pod
        return True

    def discard(self, target_id: str) -> None:
        """Terminate the pod `target_id` (not the one kept now); already gone is success."""
        if not target_id:
            return
        try:
            with_retry(lambda: self.api.act(target_id, PodAction.TERMINATE), self.api.policy, what="terminate")
        except ApiError as exc:
            if exc.kind not in (ApiErrorKind.NOT_FOUND, ApiErrorKind.CONFLICT):
                raise

    def settle_twins(self) -> str:
        """Right after this keeper's create: pods of the name made in the same moment (another keeper, `pod heal
        --replace`) are settled by one rule every keeper applies: the oldest stays, the others are terminated.
        Ours, when it is not the oldest: its id ("" when ours stays)."""
        assert self.pod is not None
        found = self._named()
        if len(found) < 2:
            return ""
        keep = settle(found, self.discard)
        if keep.id == self.pod.id:
            return ""
        mine = self.pod.id
        assert isinstance(keep, Pod)
        self.pod, self._stale = keep, None
        return mine

    def poll(self, state: KeepState, silent: set[int], *, members: bool = False) -> Observed:
        assert self.pod is not None
        try:
            pod = self.api.get_pod(self.pod.id)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise
            return Observed(None, {0: NodeState(None)})
        self.pod = pod
        if pod.data_center:
            state.data_center = pod.data_center
        self._follow(pod, state)
        want = self.spec.gpu.count if self.spec.gpu is not None else 0
        have = pod.gpu.count if pod.gpu is not None else want
        gpus = (have, want) if have < want else None
        return Observed(pod.status, {0: NodeState(pod.status, pod.has_runtime, gpus)})

    def _follow(self, pod: Pod, state: KeepState) -> None:
        """One stream per pod, opened once it runs (after a start we asked for: once the newer start runs)."""
        if pod.status is not PodStatus.RUNNING or (self._stale is not None and pod.started_at == self._stale):
            return
        self._stale = None
        if self._followed is not None and self._followed[0] == pod.id:
            return
        mark = state.nodes.get("0")
        resume = mark is not None and mark.pod_id == pod.id
        since = (mark.started_at if resume and mark is not None else None) or pod.started_at
        last = mark.last_event_id if resume and mark is not None else ""
        if not resume:
            state.nodes["0"] = NodeMark(pod.id, pod.started_at)
        tail = None if since else BACKFILL_WITHOUT_START
        self.streams.open(Member(pod, 0), since=since, tail=tail, source="container", last_event_id=last)
        self._followed = (pod.id, pod.started_at)

    def stream_lost(self, rank: int) -> None:
        """A stream that ended for good (its error was reported): reopen at the next poll, after the last event."""
        self.streams.close_node(rank)
        self._followed = None

    def start(self) -> None:
        assert self.pod is not None
        self._stale = self.pod.started_at
        self.pod = act_on(self.api, self.pod, PodAction.START).pod or self.pod

    def remove(self) -> None:
        if self.pod is None:
            return
        self.stream_lost(0)
        act_on(self.api, self.pod, PodAction.TERMINATE)  # already gone is success
        self.pod = None

    def create(self, say: Say, dc: str | None = None) -> None:
        candidates = self.spec.candidates()
        if self.spec.volume is not None and self.spec.volume.network:
            candidates = _pinned(dc, candidates)
        self.pod = create_first_fit(self.api, candidates, say=say)
        self._stale = None

    def stop(self, *, why: str) -> str:
        """Stop the pod where RunPod allows it (billing ends; disk and volume stay)."""
        if self.pod is None:
            return "no pod is left"
        try:
            pod = self.api.get_pod(self.pod.id)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise
            return f"pod {self.name} is gone"
        if pod.status in (PodStatus.EXITED, PodStatus.TERMINATED):
            return f"pod {self.name} ({pod.id}) is already {pod.status}"
        if PodAction.STOP not in (pod.actions or allowed_actions(pod.status)):
            return f"pod {self.name} ({pod.id}) is {pod.status}, which RunPod cannot stop; it is left as it is"
        try:
            act_on(self.api, pod, PodAction.STOP)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise
            return f"pod {self.name} is gone"  # gone since the read (terminated meanwhile): nothing bills
        return f"pod {self.name} ({pod.id}) stopped ({why}); its disk and volume stay"

    def close(self) -> None:
        self.streams.close()


class ClusterTarget:
    kind = "cluster"

    def __init__(self, api: ClusterApi, spec: PodSpec, tuning: Tuning, silence_s: float) -> None:
        self.api, self.spec, self.tuning, self.silence_s = api, spec, tuning, silence_s
        self.name = spec.name
        self.cluster: Cluster | None = None
        self.streams = NodeStreams(api.pods, tuning)
        self._followed: str | None = None  # the cluster id whose members' streams are open
        self._members: dict[int, Member] = {}
        self._listed_at = 0.0
        self._all_ran = False  # every node was RUNNING once: a node that leaves now is lost

    @property
    def target_id(self) -> str:
        return self.cluster.id if self.cluster is not None else ""

    def describe(self) -> str:
        return f"cluster {self.name} ({self.target_id or 'none'})"

    def up(self, say: Say) -> str:
        from podguard.pods.clusters.up import cluster_up

        result = cluster_up(self.api, self.spec, timeout_s=0, wait=False, tuning=self.tuning, progress=_Say(say))
        self.cluster = result.cluster
        return result.action

    def _named(self, exclude: str = "") -> list[Cluster]:
        what = f"look up cluster {self.name}"
        return with_retry(lambda: clusters_named(self.api, self.name, exclude=(exclude,)), self.api.policy, what=what)

    def adopt(self, *, exclude: str = "", only: str = "", prefer: str = "") -> bool:
        """The cluster of this name, whoever made it (as PodTarget.adopt); False if none."""
        cluster = pick_one(self._named(exclude), only=only, prefer=prefer)
        if cluster is None:
            return False
        assert isinstance(cluster, Cluster)
        if self.cluster is None or cluster.id != self.cluster.id:
            self.streams.close()
            self._followed, self._members, self._all_ran = None, {}, False
        self.cluster = cluster
        return True

    def discard(self, target_id: str) -> None:
        """Delete the cluster `target_id` (not the one kept now); already gone is success."""
        if not target_id:
            return
        try:
            with_retry(lambda: self.api.delete_cluster(target_id), self.api.policy, what="delete cluster")
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise

    def settle_twins(self) -> str:
        """As PodTarget.settle_twins: the oldest cluster of the name stays, the others are deleted."""
        assert self.cluster is not None
        found = self._named()
        if len(found) < 2:
            return ""
        keep = settle(found, self.discard)
        if keep.id == self.cluster.id:
            return ""
        mine = self.cluster.id
        assert isinstance(keep, Cluster)
        self.cluster = keep
        return mine

    def poll(self, state: KeepState, silent: set[int], *, members: bool = False) -> Observed:
        """The cluster's status; its members are listed (runtimes included) when a node stopped or left, when a
        silent node is due a check, or when `members` asks for it (a node's failure line: was a peer lost?)."""
        assert self.cluster is not None
        try:
            cluster = self.api.get_cluster(self.cluster.id)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise
            return Observed(None, cluster=True)
        self.cluster = cluster
        if cluster.data_center:
            state.data_center = cluster.data_center
        stopped = any(cluster.by_status.get(s.value) for s in (PodStatus.EXITED, PodStatus.ERROR))
        all_run = cluster.status is PodStatus.RUNNING and cluster.total >= cluster.nodes
        left = self._all_ran and not all_run
        due = members or (bool(silent) and time.monotonic() - self._listed_at >= self.silence_s)
        if stopped or left or due or (all_run and self._followed != cluster.id):
            self._list(state)  # one member listing: to name a lost node, check runtimes, or open the streams
        if all_run:
            self._all_ran = True
        lost: tuple[int, ...] = ()
        if stopped or left:
            down = (PodStatus.EXITED, PodStatus.ERROR, PodStatus.TERMINATED)
            lost = tuple(
                r
                for r in range(cluster.nodes)
                if (r in self._members and self._members[r].pod.status in down)
                or (left and (r not in self._members or self._members[r].pod.status is not PodStatus.RUNNING))
            )
        nodes = {r: NodeState(m.pod.status, m.pod.has_runtime if due else None) for r, m in self._members.items()}
        status = cluster.status if not lost else PodStatus.ERROR
        return Observed(status, nodes, cluster=True, lost=lost)

    def _list(self, state: KeepState) -> None:
        assert self.cluster is not None
        members = self.api.members(self.cluster.id)
        self._listed_at = time.monotonic()
        self._members = {m.rank: m for m in members if m.rank is not None}
        everyone = self.cluster.status is PodStatus.RUNNING and len(self._members) >= self.cluster.nodes
        if everyone and self._followed != self.cluster.id:
            for rank, member in sorted(self._members.items()):
                self._open(rank, member, state)
            self._followed = self.cluster.id

    def _open(self, rank: int, member: Member, state: KeepState) -> None:
        mark = state.nodes.get(str(rank))
        resume = mark is not None and mark.pod_id == member.pod.id
        since = (mark.started_at if resume and mark is not None else None) or member.pod.started_at
        last = mark.last_event_id if resume and mark is not None else ""
        if not resume:
            state.nodes[str(rank)] = NodeMark(member.pod.id, member.pod.started_at)
        tail = None if since else BACKFILL_WITHOUT_START
        self.streams.open(member, since=since, tail=tail, source="container", last_event_id=last)

    def stream_lost(self, rank: int) -> None:
        self.streams.close_node(rank)
        member = self._members.get(rank)
        if member is not None:
            self._followed = None  # the next listing reopens every node's stream after its last event

    def start(self) -> None:  # pragma: no cover - decide() never starts a cluster
        raise AssertionError("a cluster is never started, only replaced whole")

    def remove(self) -> None:
        if self.cluster is None:
            return
        self.streams.close()
        self._followed, self._members, self._all_ran = None, {}, False
        try:
            self.api.delete_cluster(self.cluster.id)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise
        self.cluster = None

    def create(self, say: Say, dc: str | None = None) -> None:
        candidates: list[ClusterRequest] = self.spec.cluster_candidates()
        if dc and self.spec.volume is not None and self.spec.volume.network:
            seen: set[object] = set()
            pinned = []
            for c in candidates:
                if c.gpu not in seen:
                    seen.add(c.gpu)
                    pinned.append(replace(c, data_center=dc))
            candidates = pinned
        self.cluster = create_cluster_first_fit(self.api, candidates, say=say)

    def stop(self, *, why: str) -> str:
        """A cluster has no stop: deleting it is what ends its billing (network volumes stay)."""
        if self.cluster is None:
            return "no cluster is left"
        cid = self.cluster.id
        self.remove()
        return f"cluster {self.name} ({cid}) deleted ({why}; a cluster has no stop); its network volume stays"

    def close(self) -> None:
        self.streams.close()


class _Say(Progress):
    """A Progress whose `say` goes to the keeper's event line (cluster_up talks through a Progress)."""

    def __init__(self, say: Say) -> None:
        super().__init__(quiet=True)
        self._to = say

    def say(self, text: str) -> None:
        self._to(text)

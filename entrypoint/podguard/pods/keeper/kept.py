"""What the keeper keeps, a pod or an Instant Cluster, as it follows it from poll to poll; the pod side is here.

    kept = KeptPod(api, spec, tuning)          # or KeptCluster(cluster_api(api), spec, tuning, silence_s)
    scan = kept.scan(adopted)                  # ONE listing of the name: the plan (converge.py) and what it saw
    kept.adopt(scan.plan.keep, scan)           # the one kept (its log stream opens once it runs)
    observed = kept.observe(state, silent)     # what decide() needs, from that same listing (no request)
    kept.start(hands); kept.remove(hands); kept.create(hands, dc); kept.stop(hands, why="...")

What a pod or a cluster is in RunPod's API (a listing of the name, the mark, the marked candidates, a create) is
pods/target.py's `Target`; a `Kept` adds the keeper's own state on top: the one kept, its log streams, what
decide() is shown. Each poll is one listing of the name (`GET /v2/pods`, whose Pod objects carry `env`: podguard's
mark), never a lookup of "the pod I created". Every action goes through the keeper's hands (actuate.py: fenced by
the user's word, read back). A replacement is "remove, then create"; a create whose answer was lost is looked up
among the keeper's own pods of the name, and one that lands later is a surplus pod at the next poll (converge.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Member
from podguard.pods.clusters.streams import NodeStreams
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.actuate import Actuator
from podguard.pods.keeper.converge import Plan, Seen, converge
from podguard.pods.keeper.decide import NodeState, Observed
from podguard.pods.keeper.record import KeepState, NodeMark
from podguard.pods.keeper.spec_change import spec_changes
from podguard.pods.mark import mark_of, stranger_line
from podguard.pods.pod import Pod, PodStatus
from podguard.pods.readiness import backfill
from podguard.pods.spec import PodSpec
from podguard.pods.target import PodTarget
from podguard.pods.tuning import Tuning

__all__ = ["Kept", "KeptPod", "Scan", "not_confirmed", "open_stream"]


@dataclass(frozen=True)
class Scan:
    """One listing of the name: the plan, and each pod (cluster) it saw, by id, and how its target names one."""

    plan: Plan
    items: Mapping[str, Any] = field(default_factory=dict)
    seen: tuple[Seen, ...] = ()
    describe: Callable[[Any], str] = stranger_line

    @property
    def mine(self) -> list[Seen]:
        """The keeper's own of the name (the one kept and the surplus)."""
        return [s for s in self.seen if s.owned and s.status is not PodStatus.TERMINATED]

    def line(self, item_id: str) -> str:
        """How a pod (cluster) of the name is named in an event: a pod's id, image and status; a cluster's id and
        node counts (pods/target.py's `describe`)."""
        return self.describe(self.items[item_id]) if item_id in self.items else item_id


class Kept(Protocol):
    kind: str
    name: str
    streams: NodeStreams

    @property
    def target_id(self) -> str: ...

    def describe(self) -> str: ...

    def scan(self, adopted: Collection[str]) -> Scan: ...

    def adopt(self, target_id: str, scan: Scan) -> bool: ...

    def forget(self) -> None: ...

    def observe(self, state: KeepState, silent: set[int], *, members: bool = False) -> Observed: ...

    def changes(self) -> list[str]: ...

    def billing(self) -> bool: ...

    def start(self, hands: Actuator) -> None: ...

    def remove(self, hands: Actuator, target_id: str) -> bool: ...

    def create(self, hands: Actuator, dc: str | None, adopted: Collection[str]) -> None: ...

    def stop(self, hands: Actuator, *, why: str, terminate_error: bool = False) -> str: ...

    def stream_lost(self, rank: int) -> None: ...

    def close(self) -> None: ...


def not_confirmed(what: str) -> ApiError:
    """An action the API took but the pod did not show within the read-back window: tried again at the next poll."""
    return ApiError(ApiErrorKind.TRANSIENT, f"{what}: not confirmed yet (the pod does not read back so)")


def open_stream(streams: NodeStreams, member: Member, state: KeepState) -> None:
    """Open a node's log stream: after its last event when the keep's record has this pod (a keeper started again),
    else from its start (the last lines when the API does not say when it started), noted in the record."""
    node, pod = str(member.rank or 0), member.pod
    mark = state.nodes.get(node)
    resume = mark is not None and mark.pod_id == pod.id
    since = (mark.started_at if resume and mark is not None else None) or pod.started_at
    last = mark.last_event_id if resume and mark is not None else ""
    if not resume:
        state.nodes[node] = NodeMark(pod.id, pod.started_at)
    streams.open(member, since=since, tail=backfill(since), source="container", last_event_id=last)


class KeptPod:
    kind = "pod"

    def __init__(self, api: PodApi, spec: PodSpec, tuning: Tuning, *, keep_id: str = "up") -> None:
        self.api, self.spec, self.tuning = api, spec, tuning
        self.target = PodTarget(api)
        self.name = spec.name
        self.keep_id = keep_id
        self.pod: Pod | None = None
        self.streams = NodeStreams(api, tuning)
        self._followed: tuple[str, str | None] | None = None  # (pod id, start) of the open stream
        self._stale: str | None = None  # a start we asked for: follow only the newer one

    @property
    def target_id(self) -> str:
        return self.pod.id if self.pod is not None else ""

    def describe(self) -> str:
        return f"pod {self.name} ({self.target_id or 'none'})"

    # -- seeing --------------------------------------------------------------------------------------------
    def scan(self, adopted: Collection[str]) -> Scan:
        named = self.target.listed(self.name)
        seen = [
            Seen(
                p.id,
                p.status,
                self.target.owner(p, self.name, adopted),
                p.created_at,
                runs=p.status is PodStatus.RUNNING and bool(p.has_runtime),
            )
            for p in named
        ]
        return Scan(converge(seen, kept=self.target_id), {p.id: p for p in named}, tuple(seen), self.target.describe)

    def adopt(self, target_id: str, scan: Scan) -> bool:
        """Keep the pod `target_id` of the scan; True when it is another one than the pod kept so far."""
        pod = scan.items.get(target_id)
        assert isinstance(pod, Pod)
        changed = self.pod is None or pod.id != self.pod.id
        if changed:
            self.stream_lost(0)
            self._stale = None
        self.pod = pod
        return changed

    def forget(self) -> None:
        self.stream_lost(0)
        self.pod, self._stale = None, None

    def observe(self, state: KeepState, silent: set[int], *, members: bool = False) -> Observed:
        """The kept pod as the last scan showed it (no request); its stream opens once it runs."""
        pod = self.pod
        if pod is None:
            return Observed(None, {0: NodeState(None)})
        if pod.data_center:
            state.data_center = pod.data_center
        self._follow(pod, state)
        mark = mark_of(pod.env)
        spec_gpus = self.spec.gpu.count if self.spec.gpu is not None else 0
        want = mark.gpus if mark is not None and mark.gpus is not None else spec_gpus  # what it was made with
        have = pod.gpu.count if pod.gpu is not None else want
        gpus = (have, want) if have < want else None
        return Observed(pod.status, {0: NodeState(pod.status, pod.has_runtime, gpus)})

    def changes(self) -> list[str]:
        """What changed in the spec since the kept pod was made ([] when nothing did, or it is not known)."""
        return spec_changes(self.pod, self.spec, None) if self.pod is not None else []

    def billing(self) -> bool:
        return self.pod is not None and self.pod.status is not PodStatus.EXITED

    def _follow(self, pod: Pod, state: KeepState) -> None:
        """One stream per pod, opened once it runs (after a start we asked for: once the newer start runs)."""
        if pod.status is not PodStatus.RUNNING or (self._stale is not None and pod.started_at == self._stale):
            return
        self._stale = None
        if self._followed is not None and self._followed[0] == pod.id:
            return
        open_stream(self.streams, Member(pod, 0), state)
        self._followed = (pod.id, pod.started_at)

    def stream_lost(self, rank: int) -> None:
        """A stream that ended for good (its error was reported): reopen at the next poll, after the last event."""
        self.streams.close_node(rank)
        self._followed = None

    # -- acting --------------------------------------------------------------------------------------------
    def start(self, hands: Actuator) -> None:
        assert self.pod is not None
        self._stale = self.pod.started_at
        started = hands.start(self.pod)
        if started is None:
            raise not_confirmed(f"start pod {self.pod.id}")
        self.pod = started

    def remove(self, hands: Actuator, target_id: str) -> bool:
        """Terminate `target_id` (the kept pod, or another of the keeper's own); True once it reads back gone."""
        if not target_id:
            return True
        if target_id == self.target_id:
            self.forget()
        return hands.terminate(target_id)

    def create(self, hands: Actuator, dc: str | None, adopted: Collection[str]) -> None:
        candidates = self.target.candidates(self.spec, keep=self.keep_id, dc=dc)

        def mine(name: str) -> list[Pod]:
            return [p for p in self.target.listed(name) if self.target.owner(p, name, adopted)]

        self.pod = hands.create(self.target, candidates, mine)
        self._stale = None

    def stop(self, hands: Actuator, *, why: str, terminate_error: bool = False) -> str:
        """Stop the kept pod (billing ends; disk and volume stay), read back. In ERROR (RunPod cannot stop it) and
        still billing, with `terminate_error`: terminated, so that nothing is left billing."""
        pod = self.pod
        if pod is None:
            return "no pod is left"
        if pod.status is PodStatus.ERROR and terminate_error and (pod.cost_per_hr is None or pod.cost_per_hr > 0):
            if not hands.terminate(pod.id):
                raise not_confirmed(f"terminate pod {pod.id}")
            self.forget()
            return (
                f"pod {self.name} ({pod.id}) was in ERROR, which RunPod cannot stop, and still billing: terminated "
                "(nothing is left billing)"
            )
        if pod.status is PodStatus.ERROR:
            return f"pod {self.name} ({pod.id}) is in ERROR and bills nothing; it is left as it is"
        done = hands.stop(pod.id)
        if not done:
            raise not_confirmed(f"stop pod {pod.id}")
        if done == "gone":
            self.forget()
            return f"pod {self.name} ({pod.id}) is gone: nothing of it bills"
        return f"pod {self.name} ({pod.id}) stopped ({why}); its disk and volume stay"

    def close(self) -> None:
        self.streams.close()

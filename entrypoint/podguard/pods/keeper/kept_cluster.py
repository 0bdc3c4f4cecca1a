"""The cluster side of what the keeper keeps: an Instant Cluster behind kept.py's interface.

    kept = KeptCluster(cluster_api(api), spec, tuning, silence_s=900, keep_id="k3-9f2a1c")
    scan = kept.scan(adopted)          # ONE `GET /v2/clusters`; a new cluster of the name: its members, once

A poll is one listing of the clusters (`GET /v2/clusters`: names and each cluster's aggregate status). A cluster's
mark is read from its member pods, once per cluster (pods/clusters/target.py's `ClusterTarget`): until its members
are listed its owner is not known, and it is waited for, never duplicated. The members are listed
again only when a node stopped or left, when a silent node is due a check, or when a node's failure asks whether a
peer was lost. A cluster has no start and no stop: it is replaced whole, and deleting it is what ends its billing.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from podguard.pods.clusters.cluster import Cluster, Member
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.clusters.streams import NodeStreams
from podguard.pods.clusters.target import ClusterTarget
from podguard.pods.keeper.actuate import Actuator
from podguard.pods.keeper.converge import Seen, converge
from podguard.pods.keeper.decide import NodeState, Observed
from podguard.pods.keeper.kept import Scan, not_confirmed, open_stream
from podguard.pods.keeper.record import KeepState
from podguard.pods.keeper.spec_change import spec_changes
from podguard.pods.pod import PodStatus
from podguard.pods.spec import PodSpec
from podguard.pods.tuning import Tuning

__all__ = ["KeptCluster"]


class KeptCluster:
    kind = "cluster"

    def __init__(
        self, api: ClusterApi, spec: PodSpec, tuning: Tuning, silence_s: float, *, keep_id: str = "up"
    ) -> None:
        self.api, self.spec, self.tuning, self.silence_s = api, spec, tuning, silence_s
        self.target = ClusterTarget(api)
        self.name = spec.name
        self.keep_id = keep_id
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

    # -- seeing --------------------------------------------------------------------------------------------
    def scan(self, adopted: Collection[str]) -> Scan:
        named = self.target.listed(self.name)
        seen = [
            Seen(
                c.id,
                c.status,
                True if c.id in adopted else self._owner(c),
                c.created_at,
                runs=c.status is PodStatus.RUNNING and c.total >= c.nodes,
            )
            for c in named
        ]
        return Scan(converge(seen, kept=self.target_id), {c.id: c for c in named}, tuple(seen), self.target.describe)

    def _owner(self, cluster: Cluster) -> bool | None:
        """Whether the cluster's members carry podguard's mark for the name; None until a member is listed. The
        listing that tells it of the kept cluster is its members too."""
        members = self.target.learn(cluster, self.name)
        if members and cluster.id == self.target_id:
            self._members = {m.rank: m for m in members if m.rank is not None}
        return self.target.owners.get(cluster.id)

    def adopt(self, target_id: str, scan: Scan) -> bool:
        cluster = scan.items.get(target_id)
        assert isinstance(cluster, Cluster)
        changed = self.cluster is None or cluster.id != self.cluster.id
        if changed:
            self.streams.close()
            self._followed, self._members, self._all_ran = None, {}, False
        self.cluster = cluster
        return changed

    def forget(self) -> None:
        self.streams.close()
        self._followed, self._members, self._all_ran = None, {}, False
        self.cluster = None

    def observe(self, state: KeepState, silent: set[int], *, members: bool = False) -> Observed:
        """The kept cluster as the last listing showed it; its members are listed (runtimes included) when a node
        stopped or left, when a silent node is due a check, or when `members` asks for it."""
        cluster = self.cluster
        if cluster is None:
            return Observed(None, cluster=True)
        if cluster.data_center:
            state.data_center = cluster.data_center
        stopped = any(cluster.by_status.get(s.value) for s in (PodStatus.EXITED, PodStatus.ERROR))
        all_run = cluster.status is PodStatus.RUNNING and cluster.total >= cluster.nodes
        left = self._all_ran and not all_run
        due = members or (bool(silent) and time.monotonic() - self._listed_at >= self.silence_s)
        if stopped or left or due or (all_run and self._followed != cluster.id):
            self._list(state)
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

    def changes(self) -> list[str]:
        if self.cluster is None or not self._members:
            return []
        first = self._members[min(self._members)]
        return spec_changes(first.pod, self.spec, self.cluster.nodes)

    def billing(self) -> bool:
        return self.cluster is not None

    def _list(self, state: KeepState) -> None:
        assert self.cluster is not None
        members = self.api.members(self.cluster.id)
        self._listed_at = time.monotonic()
        self._members = {m.rank: m for m in members if m.rank is not None}
        everyone = self.cluster.status is PodStatus.RUNNING and len(self._members) >= self.cluster.nodes
        if everyone and self._followed != self.cluster.id:
            for _rank, member in sorted(self._members.items()):
                open_stream(self.streams, member, state)
            self._followed = self.cluster.id

    def stream_lost(self, rank: int) -> None:
        self.streams.close_node(rank)
        if rank in self._members:
            self._followed = None  # the next listing reopens every node's stream after its last event

    # -- acting --------------------------------------------------------------------------------------------
    def start(self, hands: Actuator) -> None:  # pragma: no cover - decide() never starts a cluster
        raise AssertionError("a cluster is never started, only replaced whole")

    def remove(self, hands: Actuator, target_id: str) -> bool:
        if not target_id:
            return True
        if target_id == self.target_id:
            self.forget()
        return hands.delete_cluster(self.target, target_id)

    def create(self, hands: Actuator, dc: str | None, adopted: Collection[str]) -> None:
        candidates = self.target.candidates(self.spec, keep=self.keep_id, dc=dc)

        def mine(name: str) -> list[Cluster]:
            return [c for c in self.target.listed(name) if self._owner(c)]

        self.cluster = hands.create(self.target, candidates, mine)
        self.target.owners[self.cluster.id] = True

    def stop(self, hands: Actuator, *, why: str, terminate_error: bool = False) -> str:
        """A cluster has no stop: deleting it is what ends its billing (network volumes stay)."""
        if self.cluster is None:
            return "no cluster is left"
        cid = self.cluster.id
        if not self.remove(hands, cid):
            raise not_confirmed(f"delete cluster {cid}")
        return f"cluster {self.name} ({cid}) deleted ({why}; a cluster has no stop); its network volume stays"

    def close(self) -> None:
        self.streams.close()

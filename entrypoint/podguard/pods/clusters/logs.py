"""`pod logs` of a cluster: every node's lines prefixed `node<R>: `, or one node's (`--node R`).

    for rank, event in cluster_log_events(clusters, members, tail=100, follow=False, tuning=Tuning()):
        print(f"node{rank}: {event.line}")

One stream per node (pods/follow.py), merged in arrival order. Without `--follow` it ends once every
stream's backfill went quiet (`logs_idle_s`), as `pod logs` of a pod does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from podguard.errors import UsageError
from podguard.pods.clusters.cluster import Member
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.clusters.streams import NodeStreams
from podguard.pods.errors import ApiError
from podguard.pods.pod import LogEvent
from podguard.pods.tuning import Tuning

__all__ = ["cluster_log_events", "pick_nodes"]


def pick_nodes(members: Sequence[Member], node: int | None, name: str) -> list[Member]:
    """All members, or the one of rank `node` (64 naming the valid ranks when there is none)."""
    if node is None:
        return list(members)
    chosen = [m for m in members if m.rank == node]
    if not chosen:
        ranks = ", ".join(str(m.rank) for m in members if m.rank is not None) or "none yet"
        raise UsageError(f"--node {node} is not a node of cluster {name}; its ranks: {ranks}")
    return chosen


def cluster_log_events(
    api: ClusterApi, members: Sequence[Member], *, tail: int, follow: bool, tuning: Tuning, limit_s: float = 60.0
) -> Iterator[tuple[int, LogEvent]]:
    """(rank, event) from every member's stream; ends after the backfill unless `follow`."""
    with NodeStreams(api.pods, tuning) as streams:
        for member in members:
            streams.open(member, since=None, tail=tail, source=None)
        deadline = None if follow else time.monotonic() + limit_s
        while deadline is None or time.monotonic() < deadline:
            got = streams.get(3600.0 if follow else tuning.logs_idle_s)
            if got is None:
                if follow:
                    continue
                return
            rank, item = got
            if isinstance(item, ApiError):
                raise item
            yield rank, item

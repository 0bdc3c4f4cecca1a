"""One log stream per node, all feeding one queue: what `pod up` waits on and what `pod logs` prints.

    nodes = NodeStreams(api.pods, tuning)
    nodes.open(member, since=member.pod.started_at, tail=None, source="container")
    item = nodes.get(timeout=1.0)     # (rank, LogEvent | ApiError), or None when nothing came
    nodes.close()

Each node's stream is a pods/follow.py LogFollower (resumed after drops, no polling). Reopening a node's
stream (its pod restarted) bumps its generation; lines still in flight from the old stream are dropped.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterable

from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Member
from podguard.pods.errors import ApiError
from podguard.pods.follow import LogFollower
from podguard.pods.pod import LogEvent
from podguard.pods.tuning import Tuning

__all__ = ["NodeStreams", "prefixed"]

Item = tuple[int, LogEvent | ApiError]


class NodeStreams:
    def __init__(self, api: PodApi, tuning: Tuning) -> None:
        self._api = api
        self._tuning = tuning
        self._queue: queue.Queue[tuple[int, int, LogEvent | ApiError]] = queue.Queue()
        self._followers: dict[int, LogFollower] = {}
        self._generation: dict[int, int] = {}

    def open(
        self, member: Member, *, since: str | None, tail: int | None, source: str | None, last_event_id: str = ""
    ) -> None:
        """Start following `member`'s log (closing the stream it had, if any), after `last_event_id` if given."""
        rank = member.rank if member.rank is not None else -1
        self.close_node(rank)
        generation = self._generation.get(rank, 0) + 1
        self._generation[rank] = generation
        follower = LogFollower(
            self._api,
            member.pod.id,
            since=since,
            tail=tail,
            source=source,
            backoff_s=self._tuning.backoff_s,
            backoff_cap_s=self._tuning.backoff_cap_s,
            sink=lambda item: self._queue.put((rank, generation, item)),
            last_event_id=last_event_id,
        )
        self._followers[rank] = follower
        follower.start()

    def get(self, timeout: float) -> Item | None:
        """The next (rank, item) of a current stream, or None when nothing came within `timeout` seconds.

        Lines of a replaced stream are skipped in a loop (a restarted node can leave thousands queued)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                rank, generation, item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return None
            if self._generation.get(rank) == generation:
                return rank, item

    def close_node(self, rank: int) -> None:
        follower = self._followers.pop(rank, None)
        if follower is not None:
            follower.stop()

    def close(self) -> None:
        for rank in list(self._followers):
            self.close_node(rank)

    def __enter__(self) -> NodeStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefixed(rank: int, lines: Iterable[str]) -> list[str]:
    """`node<R>: ` before each line, the way `pod logs` of a cluster shows them."""
    return [f"node{rank}: {line}" for line in lines]

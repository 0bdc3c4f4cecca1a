"""Is the cluster ready? Every node RUNNING, and every node's preflight summary since its start says PASS.

    outcome = wait_cluster_ready(clusters, cluster.id, timeout_s=1800, tuning=Tuning())   # its lines: the console
    outcome.code     # 0 all PASS; 76 a node said BUSY/UNHEALTHY/FAIL (outcome.failed: its rank); 75 timeout

The request budget does not grow with the node count: while nodes provision, one `GET /v2/clusters/{id}`
per poll (its aggregate `pods.byStatus` says how many run); once all run, the members are listed once and
each node's log is followed on its own stream (no log polling), beside the same one cluster GET per poll.
Only when that aggregate shows a node leaving RUNNING are the members listed again, to name it (or, when it
restarted, to follow its new start). With `fail_fast` the first node whose verdict is not PASS ends the
wait at once; without it (heal) every node's verdict is collected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from podguard import console
from podguard.errors import ExitCode
from podguard.pods.clusters.cluster import Cluster, Member
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.clusters.streams import NodeStreams, prefixed
from podguard.pods.errors import ApiError
from podguard.pods.pod import LogEvent, PodStatus
from podguard.pods.readiness import Verdict, backfill, parse_verdict
from podguard.pods.tuning import Tuning

__all__ = ["ClusterOutcome", "wait_cluster_ready"]

_STOPPED = (PodStatus.EXITED, PodStatus.ERROR, PodStatus.TERMINATED)


@dataclass(frozen=True)
class ClusterOutcome:
    code: int
    cluster: Cluster
    members: list[Member]
    message: str
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # rank -> the verdict that counted
    failed: list[int] = field(default_factory=list)  # ranks whose verdict was not PASS, or that stopped

    @property
    def lines(self) -> list[str]:
        """The failing nodes' own lines, each prefixed `node<R>: `."""
        out: list[str] = []
        for rank in self.failed:
            verdict = self.verdicts.get(rank)
            if verdict is not None:
                out += prefixed(rank, verdict.lines)
        return out


class _Watch:
    """The shared state of one wait: deadline, the last cluster summary shown."""

    def __init__(self, api: ClusterApi, cluster_id: str, timeout_s: float, tuning: Tuning) -> None:
        self.api = api
        self.cluster_id = cluster_id
        self.timeout_s = timeout_s
        self.tuning = tuning
        self.deadline = time.monotonic() + timeout_s
        self._shown = ""

    def poll(self) -> Cluster:
        cluster = self.api.get_cluster(self.cluster_id)
        summary = cluster.summary()
        if summary != self._shown:
            console.say(f"cluster {cluster.name} ({cluster.id}): {summary}")
            self._shown = summary
        return cluster

    def sleep_until(self, moment: float) -> None:
        time.sleep(max(min(moment, self.deadline) - time.monotonic(), 0.0))

    def outcome(
        self,
        code: int,
        message: str,
        *,
        members: list[Member] | None = None,
        verdicts: dict[int, Verdict] | None = None,
        failed: list[int] | None = None,
    ) -> ClusterOutcome:
        """The result with a fresh cluster; `members` as last listed (they were RUNNING), else listed now."""
        cluster = self.api.get_cluster(self.cluster_id)
        listed = members if members is not None else self.api.members(self.cluster_id)
        return ClusterOutcome(code, cluster, listed, message, verdicts or {}, failed or [])


def wait_cluster_ready(
    api: ClusterApi,
    cluster_id: str,
    *,
    timeout_s: float,
    tuning: Tuning,
    fail_fast: bool = True,
) -> ClusterOutcome:
    """Wait until every node runs, then for every node's verdict line (see the module docstring)."""
    watch = _Watch(api, cluster_id, timeout_s, tuning)
    while True:
        cluster = watch.poll()
        if cluster.status is PodStatus.RUNNING and cluster.total >= cluster.nodes:
            break
        if any(cluster.by_status.get(s.value) for s in (PodStatus.EXITED, PodStatus.ERROR)):
            return _stopped(watch, "did not start")
        if time.monotonic() >= watch.deadline:
            return watch.outcome(
                ExitCode.GPUS_BUSY, f"cluster {cluster.name} did not start within {timeout_s:g}s ({cluster.summary()})"
            )
        watch.sleep_until(time.monotonic() + tuning.poll_s)
    members = api.members(cluster_id)
    console.say(f"cluster {cluster.name}: all {cluster.nodes} nodes RUNNING; following each node's log")
    with NodeStreams(api.pods, tuning) as streams:
        return _verdicts(watch, cluster, members, streams, fail_fast=fail_fast)


def _open(streams: NodeStreams, member: Member) -> None:
    streams.open(member, since=member.pod.started_at, tail=backfill(member.pod.started_at), source="container")


def _verdicts(
    watch: _Watch, cluster: Cluster, members: list[Member], streams: NodeStreams, *, fail_fast: bool
) -> ClusterOutcome:
    by_rank = {m.rank if m.rank is not None else -1: m for m in members}
    for member in members:
        _open(streams, member)
    pending: dict[int, tuple[Verdict, float]] = {}  # rank -> (newest verdict, when it settles)
    settled: dict[int, Verdict] = {}
    next_poll = time.monotonic() + watch.tuning.poll_s
    while True:
        now = time.monotonic()
        for rank, (verdict, settle_at) in list(pending.items()):
            if now >= settle_at:
                del pending[rank]
                settled[rank] = verdict
                console.say(f"node{rank} ({by_rank[rank].pod.id}): preflight {verdict.word}")
                if fail_fast and not verdict.passed:
                    return _failed(watch, cluster, settled, _ranked(by_rank))
        if len(settled) >= len(by_rank):
            if all(v.passed for v in settled.values()):
                message = f"cluster {cluster.name}: preflight PASS on all {len(settled)} nodes"
                return watch.outcome(ExitCode.OK, message, members=_ranked(by_rank), verdicts=settled)
            return _failed(watch, cluster, settled, _ranked(by_rank))
        if now >= watch.deadline:
            silent = ", ".join(f"node{r}" for r in sorted(by_rank) if r not in settled)
            return watch.outcome(
                ExitCode.GPUS_BUSY,
                f"no preflight verdict from {silent} of cluster {cluster.name} within {watch.timeout_s:g}s "
                f"(see `podguard pod logs {cluster.name}`)",
                verdicts=settled,
            )
        wake = min([next_poll, watch.deadline, *(s for _, s in pending.values())])
        got = streams.get(wake - now)
        if got is not None:
            rank, item = got
            if isinstance(item, ApiError):
                raise item
            _take(item, rank, pending, settled, watch.tuning)
        if time.monotonic() >= next_poll:
            next_poll = time.monotonic() + watch.tuning.poll_s
            fresh = watch.poll()
            if fresh.running() < fresh.nodes:  # a node left RUNNING: list the members to see which and why
                stopped = _recheck(watch, by_rank, streams, pending, settled)
                if stopped is not None:
                    return stopped


def _take(
    event: LogEvent, rank: int, pending: dict[int, tuple[Verdict, float]], settled: dict[int, Verdict], tuning: Tuning
) -> None:
    if rank in settled:
        return
    found = parse_verdict(event.line)
    if found is not None:
        pending[rank] = (found, time.monotonic() + tuning.settle_s)
    elif rank in pending and event.line.startswith("  "):
        pending[rank][0].lines.append(event.line.rstrip())


def _recheck(
    watch: _Watch,
    by_rank: dict[int, Member],
    streams: NodeStreams,
    pending: dict[int, tuple[Verdict, float]],
    settled: dict[int, Verdict],
) -> ClusterOutcome | None:
    """Members after the aggregate showed a node leave RUNNING: a stopped node ends the wait (75, named);
    a restarted one is followed again from its new start."""
    members = {m.rank if m.rank is not None else -1: m for m in watch.api.members(watch.cluster_id)}
    gone = [r for r in by_rank if r not in members or members[r].pod.status in _STOPPED]
    if gone:
        return _stopped(watch, "stopped before its preflight said", ranks=gone)
    for rank, member in members.items():
        old = by_rank.get(rank)
        if old is not None and member.pod.started_at and member.pod.started_at != old.pod.started_at:
            console.say(f"node{rank} ({member.pod.id}) restarted: following its new start")
            by_rank[rank] = member
            pending.pop(rank, None)
            settled.pop(rank, None)
            _open(streams, member)
    return None


def _stopped(watch: _Watch, what: str, ranks: list[int] | None = None) -> ClusterOutcome:
    members = watch.api.members(watch.cluster_id)
    if ranks is None:
        ranks = [m.rank if m.rank is not None else -1 for m in members if m.pod.status in _STOPPED]
    states = {m.rank: m.pod.status for m in members}
    named = ", ".join(f"node{r} ({states.get(r, 'gone')})" for r in ranks) or "a node"
    cluster = watch.api.get_cluster(watch.cluster_id)
    return ClusterOutcome(
        ExitCode.GPUS_BUSY, cluster, members, f"cluster {cluster.name}: {named} {what}", failed=sorted(ranks)
    )


def _ranked(by_rank: dict[int, Member]) -> list[Member]:
    return [by_rank[r] for r in sorted(by_rank)]


def _failed(watch: _Watch, cluster: Cluster, settled: dict[int, Verdict], members: list[Member]) -> ClusterOutcome:
    failed = sorted(r for r, v in settled.items() if not v.passed)
    named = ", ".join(f"node{r} {settled[r].word}" for r in failed)
    return watch.outcome(
        ExitCode.GPU_UNHEALTHY,
        f"cluster {cluster.name} ({cluster.id}): preflight failed on {named}",
        members=members,
        verdicts=settled,
        failed=failed,
    )

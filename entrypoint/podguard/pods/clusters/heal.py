"""`pod heal` of a cluster: restart the sick nodes where the API allows it, else recreate the whole cluster.

    result = cluster_heal(clusters, cluster, replace=True, timeout_s=900, tuning=Tuning())   # each step a console line
    result.code   # 0 healthy (or a step made it so); 76 still failing; 69 no capacity; 64 needs --replace

1. Judge: every node's verdict since its start (no fail-fast: all sick nodes are named).
2. Restart the sick members (pod `restart`, or `start` for a stopped one). REST v2 may refuse actions on a
   member (409, 400 or 403: `rest.member_refused`): an expected answer that means only recreating can help.
3. With `--replace`: delete the cluster and create one of the same shape (image, args, env, ports, disk,
   GPU type and count per node, node count, type) and the same name and network volume, in the volume's
   data centre. Delete first: a second cluster of the same name would break `pod up`'s idempotency, and a
   cluster-sized block of GPUs twice over in one data centre is rarely free. See docs/pods.md.
   Whatever fails after the delete (no capacity, the API, the wait, Ctrl-C) ends the heal with a result, so the
   record is written, and the message says that the old cluster is gone and what to run next.
"""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, field

from podguard import console
from podguard.errors import ExitCode, PodguardError
from podguard.pods.clusters.cluster import Cluster, ClusterRequest, Member
from podguard.pods.clusters.placement import create_cluster_first_fit
from podguard.pods.clusters.readiness import ClusterOutcome, wait_cluster_ready
from podguard.pods.clusters.rest import ClusterApi, member_refused
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.heal import HealStep, StepRecord, Steps
from podguard.pods.mark import kept_or_marked
from podguard.pods.pod import PodAction, PodStatus
from podguard.pods.tuning import Tuning

__all__ = ["ClusterHealResult", "cluster_heal", "cluster_heal_record", "replacement_cluster"]


@dataclass
class ClusterHealResult:
    code: int
    cluster: Cluster
    members: list[Member]
    steps: list[StepRecord]
    message: str
    lines: list[str] = field(default_factory=list)


def replacement_cluster(cluster: Cluster, members: list[Member]) -> ClusterRequest:
    """The same cluster again: shape from the cluster, container config and volume from its primary node; podguard's
    mark kept (the cluster's own), or given (one for its name) when it had none: podguard made the new one."""
    model = next((m for m in members if m.rank == 0), members[0]).pod
    volume = model.volume
    env = kept_or_marked(model.env, cluster.name, cluster.gpu.count, made_by="heal")
    return ClusterRequest(
        name=cluster.name,
        type=cluster.type,
        image=model.image,
        gpu=cluster.gpu,
        nodes=cluster.nodes,
        args=model.args,
        env=env,
        ports=model.port_specs,
        disk_gb=model.disk_gb or 50,
        data_center=cluster.data_center if volume is not None and volume.network else None,
        volume=volume,
        ssh=True,
    )


class _Healer(Steps):
    def __init__(self, api: ClusterApi, timeout_s: float, tuning: Tuning) -> None:
        super().__init__()
        self.api, self.timeout_s, self.tuning = api, timeout_s, tuning
        self.refusal: ApiError | None = None  # how RunPod refused an action on a member

    def judge(self, cluster_id: str) -> ClusterOutcome:
        return wait_cluster_ready(self.api, cluster_id, timeout_s=self.timeout_s, tuning=self.tuning, fail_fast=False)

    def restart(self, outcome: ClusterOutcome, sick: list[int]) -> ClusterOutcome | None:
        """Restart the sick members; None when the API refuses actions on members (`member_refused`)."""
        cluster = outcome.cluster
        targets = [m for m in outcome.members if m.rank in sick]
        console.say(f"heal step 1: restart {', '.join(m.label for m in targets)} of cluster {cluster.name}")
        before = {m.pod.id: m.pod.started_at for m in targets}
        for member in targets:
            action = PodAction.RESTART if member.pod.status is PodStatus.RUNNING else PodAction.START
            try:
                self.api.pods.act(member.pod.id, action)
            except ApiError as exc:
                if not member_refused(exc):
                    raise
                self.refusal = exc
                self.record(HealStep.RESTART, "refused", f"{member.label}: {exc.detail or exc.message}", cluster)
                return None
        if not self._restarted(cluster.id, before):
            self.record(HealStep.RESTART, "no-effect", "accepted, but the nodes did not restart", cluster)
            return outcome
        judged = self.judge(cluster.id)
        self._judged(HealStep.RESTART, judged)
        return judged

    def _restarted(self, cluster_id: str, before: dict[str, str | None]) -> bool:
        """Poll the members (one request per poll) until every restarted one shows a new start or left RUNNING."""
        deadline = time.monotonic() + min(self.timeout_s, self.tuning.restart_confirm_s)
        while True:
            members = {m.pod.id: m.pod for m in self.api.members(cluster_id)}
            if all(
                pid in members and (members[pid].started_at != started or members[pid].status is not PodStatus.RUNNING)
                for pid, started in before.items()
            ):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(max(min(self.tuning.poll_s, deadline - time.monotonic()), 0.0))

    def replace(self, outcome: ClusterOutcome) -> ClusterOutcome | tuple[int, str]:
        """Delete the cluster, create it again and judge the new one; (exit code, message) when that fails."""
        old = outcome.cluster
        request = replacement_cluster(old, outcome.members)
        console.say(f"heal step 2: recreate cluster {old.name} ({old.id}): delete it, then create {request.describe()}")
        try:
            self.api.delete_cluster(old.id)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                self.record(HealStep.REPLACE, "error", f"delete: {exc.message}", old)
                kept = f"cluster {old.name} ({old.id}) was not deleted; nothing was replaced"
                return exc.code, f"{exc.message}\n  {kept}"
        redo = "`podguard pod up --spec FILE` (the cluster's spec) recreates it"
        new: Cluster | None = None
        try:
            new = create_cluster_first_fit(self.api, [request], exclude={old.id})
            judged = wait_cluster_ready(self.api, new.id, timeout_s=self.timeout_s, tuning=self.tuning)
        except (PodguardError, KeyboardInterrupt) as exc:
            code = exc.code if isinstance(exc, PodguardError) else 128 + signal.SIGINT
            message = exc.message if isinstance(exc, PodguardError) else "interrupted"
            capacity = isinstance(exc, ApiError) and exc.kind in (ApiErrorKind.NO_CAPACITY, ApiErrorKind.REJECTED)
            code = ExitCode.GPUS_MISSING if capacity and new is None else code
            if new is None:
                self.record(HealStep.REPLACE, "no-capacity" if capacity else "error", message, old)
                when = " when capacity returns" if capacity else ""
                gone = f"cluster {old.name} ({old.id}) was deleted and no new one was created: {redo}{when}"
            else:
                self.record(HealStep.REPLACE, "error", message, new)
                gone = (
                    f"cluster {old.name} ({old.id}) was deleted and {new.id} created in its place, but it was not "
                    f"judged: `podguard pod wait {old.name}` follows it, `podguard pod down {old.name}` removes it"
                )
            return code, f"{message}\n  {gone}"
        self._judged(HealStep.REPLACE, judged)
        return judged

    def _judged(self, step: HealStep, outcome: ClusterOutcome) -> None:
        self.record_judged(step, outcome.code == ExitCode.OK, bool(outcome.verdicts), outcome.message, outcome.cluster)


def _sick(outcome: ClusterOutcome) -> list[int]:
    if outcome.failed:
        return outcome.failed
    return sorted(m.rank for m in outcome.members if m.rank is not None and m.rank not in outcome.verdicts)


def cluster_heal(
    api: ClusterApi, cluster: Cluster, *, replace: bool, timeout_s: float, tuning: Tuning
) -> ClusterHealResult:
    """Judge, restart the sick nodes where allowed, then (with --replace) recreate the cluster."""
    healer = _Healer(api, timeout_s, tuning)
    judged = healer.judge(cluster.id)
    if judged.code == ExitCode.OK:
        return ClusterHealResult(ExitCode.OK, judged.cluster, judged.members, healer.steps, judged.message)
    sick = _sick(judged)
    console.say(f"cluster {cluster.name}: sick {', '.join(f'node{r}' for r in sick)}: {judged.message}")
    restarted = healer.restart(judged, sick)
    if restarted is not None and restarted.code == ExitCode.OK:
        return _result(healer, restarted)
    last = restarted or judged
    if not replace:
        if restarted is None:
            status = f"HTTP {healer.refusal.status}" if healer.refusal and healer.refusal.status else "refused"
            message = (
                f"RunPod refuses actions on the member nodes of cluster {cluster.name} ({status}): only recreating "
                f"it can help; rerun with --replace (recreates all {cluster.nodes} nodes, keeping the name and "
                "network volume)"
            )
            return ClusterHealResult(ExitCode.USAGE, last.cluster, last.members, healer.steps, message, last.lines)
        return _result(healer, last, hint="rerun with --replace to recreate the cluster on other machines")
    replaced = healer.replace(last)
    if isinstance(replaced, tuple):
        code, message = replaced
        return ClusterHealResult(code, last.cluster, [], healer.steps, message)
    return _result(healer, replaced)


def _result(healer: _Healer, outcome: ClusterOutcome, hint: str = "") -> ClusterHealResult:
    code = ExitCode.OK if outcome.code == ExitCode.OK else ExitCode.GPU_UNHEALTHY
    message = outcome.message + (f"; {hint}" if hint and code != ExitCode.OK else "")
    return ClusterHealResult(code, outcome.cluster, outcome.members, healer.steps, message, outcome.lines)


def cluster_heal_record(cluster: Cluster, result: ClusterHealResult) -> dict[str, object]:
    """The JSON record of a cluster heal run (steps in order)."""
    return {
        "cluster": {"id": cluster.id, "name": cluster.name, "nodes": cluster.nodes},
        "code": result.code,
        "message": result.message,
        "result_cluster": result.cluster.id,
        "steps": [asdict(s) for s in result.steps],
    }

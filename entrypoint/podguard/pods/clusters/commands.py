"""The bodies of `podguard pod …` when the spec or POD is a cluster; cli/pods.py dispatches here.

    up(client, spec, timeout_s=..., wait=True, as_json=True, tuning=...)   # lines on the console, the result on stdout
    show(client, cluster, as_json=True)

Output follows docs/formats.md: `--json` is the pod keys (gpu per node, cost_per_hr the sum, ssh the primary's)
plus `"nodes"` and `"members"` (pod objects with `"rank"`); failures exit with the pod commands' codes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.pods.actions import act_on
from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Cluster, Member, cluster_view
from podguard.pods.clusters.heal import cluster_heal, cluster_heal_record
from podguard.pods.clusters.logs import cluster_log_events, pick_nodes
from podguard.pods.clusters.readiness import ClusterOutcome, wait_cluster_ready
from podguard.pods.clusters.render import cluster_details, listing_table
from podguard.pods.clusters.rest import ClusterApi, cluster_api, member_refused, not_a_cluster_action
from podguard.pods.clusters.target import listing
from podguard.pods.clusters.up import cluster_up
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.pod import PodAction, public_view
from podguard.pods.spec import PodSpec
from podguard.pods.tuning import Tuning

__all__ = ["act_on_member", "down", "heal", "list_all", "logs", "refuse_action", "show", "up", "wait"]


def _emit(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


def _print(cluster: Cluster, members: list[Member], as_json: bool, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        _emit({**cluster_view(cluster, members), **(extra or {})})
    else:
        print(cluster_details(cluster, members))


def show(client: PodApi, cluster: Cluster, *, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    api = cluster_api(client)
    _print(cluster, api.members(cluster.id), as_json, extra)


def _failure(outcome: ClusterOutcome) -> PodguardError:
    name = outcome.cluster.name
    lines = [outcome.message, *[f"  | {line}" for line in outcome.lines]]
    lines.append(
        f"  the cluster is left running for inspection: `podguard pod logs {name} --node R`; "
        f"remove it with `podguard pod down {name}` or try `podguard pod heal {name}`"
    )
    return PodguardError("\n".join(lines), outcome.code)


def _ready_extra(outcome: ClusterOutcome | None) -> dict[str, Any]:
    if outcome is None:
        return {"ready": None}
    extra: dict[str, Any] = {"ready": outcome.code == ExitCode.OK}
    if outcome.verdicts:
        words = {v.word for v in outcome.verdicts.values()}
        failed = [outcome.verdicts[r].word for r in outcome.failed if r in outcome.verdicts]
        extra["verdict"] = failed[0] if failed else ("PASS" if words == {"PASS"} else None)
        extra["verdicts"] = {f"node{r}": v.word for r, v in sorted(outcome.verdicts.items())}
        extra["preflight"] = outcome.lines
    if outcome.failed:
        extra["failed_nodes"] = outcome.failed
    return extra


def up(
    client: PodApi,
    spec: PodSpec,
    *,
    timeout_s: float,
    wait: bool,
    as_json: bool,
    tuning: Tuning,
    adopt: tuple[str, ...] = (),
) -> None:
    api = cluster_api(client)
    result = cluster_up(api, spec, timeout_s=timeout_s, wait=wait, tuning=tuning, adopt=adopt)
    console.settle()
    outcome = result.outcome
    members = outcome.members if outcome is not None else api.members(result.cluster.id)
    _print(result.cluster, members, as_json, {"action": result.action, **_ready_extra(outcome)})
    if outcome is not None and outcome.code != ExitCode.OK:
        raise _failure(outcome)


def wait(client: PodApi, cluster: Cluster, *, timeout_s: float, as_json: bool, tuning: Tuning) -> None:
    outcome = wait_cluster_ready(cluster_api(client), cluster.id, timeout_s=timeout_s, tuning=tuning)
    console.settle()
    _print(outcome.cluster, outcome.members, as_json, _ready_extra(outcome))
    if outcome.code != ExitCode.OK:
        raise _failure(outcome)


def list_all(client: PodApi, *, as_json: bool) -> None:
    """Pods and clusters: one item per cluster (with "nodes"); its members are not listed as pods."""
    pods, clusters = listing(client)
    if as_json:
        _emit([public_view(p) for p in pods] + [cluster_view(c, m) for c, m in clusters])
    else:
        print(listing_table(pods, clusters))


def logs(
    client: PodApi, cluster: Cluster, *, node: int | None, tail: int, follow: bool, as_json: bool, tuning: Tuning
) -> None:
    api: ClusterApi = cluster_api(client)
    members = pick_nodes(api.members(cluster.id), node, cluster.name)
    for rank, event in cluster_log_events(api, members, tail=tail, follow=follow, tuning=tuning):
        if as_json:
            print(json.dumps({**asdict(event), "rank": rank}), flush=True)
        else:
            print(f"node{rank}: {event.line}", flush=True)


def refuse_action(cluster: Cluster, action: PodAction) -> PodguardError:
    return not_a_cluster_action(cluster.name, str(action))


def act_on_member(client: PodApi, member: Member, action: PodAction) -> Any:
    """An action on one node's pod: RunPod may allow it; a refusal (409, 400 or 403: `member_refused`) is one line
    naming the cluster's own commands (64)."""
    try:
        return act_on(client, member.pod, action)
    except (UsageError, ApiError) as exc:
        if isinstance(exc, ApiError) and not member_refused(exc):
            raise
        verb = "down" if action is PodAction.TERMINATE else str(action)
        cid = member.cluster_id or "?"
        status = f" (HTTP {exc.status})" if isinstance(exc, ApiError) and exc.status else ""
        raise UsageError(
            f"pod {member.pod.id} is {member.label} of cluster {cid}: RunPod refused {verb} of a member node{status}; "
            f"manage it through its cluster: `podguard pod heal {cid}` or `podguard pod down {cid}`"
        ) from None


def down(client: PodApi, cluster: Cluster, *, as_json: bool) -> None:
    api = cluster_api(client)
    try:
        api.delete_cluster(cluster.id)
        message, changed = f"cluster {cluster.name} ({cluster.id}) deleted: all {cluster.nodes} nodes", True
    except ApiError as exc:
        if exc.kind is not ApiErrorKind.NOT_FOUND:
            raise
        message, changed = f"cluster {cluster.name} ({cluster.id}) is already gone", False
    console.say(message)
    if as_json:
        _emit({"id": cluster.id, "name": cluster.name, "nodes": cluster.nodes, "changed": changed, "terminated": True})


def heal(
    client: PodApi,
    cluster: Cluster,
    *,
    replace: bool,
    timeout_s: float,
    as_json: bool,
    tuning: Tuning,
) -> dict[str, Any]:
    """Run the cluster heal; print the result; return the heal record (the CLI saves it). Raises on failure."""
    result = cluster_heal(cluster_api(client), cluster, replace=replace, timeout_s=timeout_s, tuning=tuning)
    console.settle()
    record = cluster_heal_record(cluster, result)
    _print(result.cluster, result.members, as_json, {"heal": record})
    if result.code != ExitCode.OK:
        lines = [result.message, *[f"  | {line}" for line in result.lines]]
        raise HealFailed("\n".join(lines), result.code, record)
    return record


class HealFailed(PodguardError):
    """A cluster heal that did not end healthy; carries its record so the CLI can still save it."""

    def __init__(self, message: str, code: int, record: dict[str, Any]) -> None:
        super().__init__(message, code)
        self.record = record

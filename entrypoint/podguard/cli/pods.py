"""`podguard pod …` and `podguard template push`: RunPod pods from a laptop, thin commands over podguard.pods.

Registered only when the first argument is `pod` or `template` (or for the full help). Nothing here
imports an API client before a command runs, and only `--api graphql` / spot specs load the `runpod` SDK.
Exit codes (PRODUCT.md): 64 bad spec/arguments or an action the status does not allow, 66 no such pod,
69 no capacity, 75 transient API failure or a wait timed out, 76 the pod's preflight failed, 77 key/account.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeGuard

import typer

from podguard.errors import ExitCode, PodguardError, UsageError

if TYPE_CHECKING:
    from podguard.pods.api import PodApi
    from podguard.pods.clusters.model import Cluster
    from podguard.pods.model import Pod
    from podguard.pods.progress import Progress
    from podguard.pods.readiness import ReadyOutcome
    from podguard.pods.spec import PodSpec
    from podguard.pods.tuning import Tuning

pod_app = typer.Typer(
    name="pod",
    help="Create, watch, restart and heal RunPod pods (REST v2; `--api graphql` through the runpod SDK).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
template_app = typer.Typer(
    name="template",
    help="RunPod templates whose start command runs this image's entrypoint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Json = Annotated[bool, typer.Option("--json", envvar="PODGUARD_JSON", help="Print machine-readable JSON.")]
Api = Annotated[
    str | None,
    typer.Option(
        "--api", envvar="PODGUARD_API", help="rest (default) or graphql (the runpod SDK; spot specs use it anyway)."
    ),
]
RetryFor = Annotated[
    float,
    typer.Option(
        "--retry-for", envvar="PODGUARD_RETRY_FOR", min=0.0, help="Seconds to retry a transient API failure per call."
    ),
]
PodRef = Annotated[str, typer.Argument(help="The pod's name or id.", show_default=False)]
SpecFile = Annotated[
    Path, typer.Option("--spec", envvar="PODGUARD_SPEC", help="The pod spec (TOML), e.g. runpod/pod.toml.")
]


def register(app: typer.Typer, only: str | None = None) -> None:
    if only in (None, "pod"):
        from podguard.cli import pod_recovery  # noqa: F401 (its commands, heal and keep, join pod_app)

        app.add_typer(pod_app, name="pod")
    if only in (None, "template"):
        app.add_typer(template_app, name="template")


# -- helpers ---------------------------------------------------------------------------------------------
def _api(kind: str | None, retry_for: float, *, spec: PodSpec | None = None) -> PodApi:
    from podguard.pods.api import ApiKind, open_api

    valid = ", ".join(k.value for k in ApiKind)
    if kind is not None and kind not in {k.value for k in ApiKind}:
        raise UsageError(f"--api={kind!r} is not valid; expected one of {valid}")
    if spec is not None and spec.interruptible:
        if kind == ApiKind.REST:
            raise UsageError("--api=rest cannot create spot pods (REST v2 has no spot field); drop --api")
        kind = ApiKind.GRAPHQL
    if spec is not None and spec.cluster is not None and kind == ApiKind.GRAPHQL:
        raise UsageError("clusters are created through REST v2 only; drop --api graphql for this spec")
    if spec is not None and spec.cpu is not None and kind == ApiKind.GRAPHQL:
        raise UsageError("CPU pods are created through REST; drop --api graphql for this spec")
    try:
        return open_api(kind or ApiKind.REST, retry_for=retry_for)
    except ImportError:
        raise UsageError(
            "GraphQL (spot pods, --api graphql) needs the runpod SDK: pip install 'podguard[pods]'"
        ) from None


def _client_and_pod(
    kind: str | None, retry_for: float, ref: str, *, member_as_cluster: bool = False
) -> tuple[PodApi, Pod | Cluster]:
    """An API client and the pod or cluster named `ref` (by id or name); exit 66 when there is none.

    A cluster member's id names that node's pod, or its cluster with `member_as_cluster` (heal)."""
    from podguard.pods.clusters.model import Member
    from podguard.pods.clusters.rest import cluster_api
    from podguard.pods.clusters.target import find_target

    client = _api(kind, retry_for)
    target = find_target(client, ref)
    assert target is not None  # find_target raises NOT_FOUND (66) unless missing_ok
    if isinstance(target, Member):
        if member_as_cluster and target.cluster_id:
            return client, cluster_api(client).get_cluster(target.cluster_id)
        return client, target.pod
    return client, target


def _is_cluster(target: object) -> TypeGuard[Cluster]:
    from podguard.pods.clusters.model import Cluster

    return isinstance(target, Cluster)


def _progress(quiet: bool = False) -> Progress:
    from podguard.pods.progress import Progress

    return Progress(sys.stderr, quiet=quiet)


def _emit(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


def _show(pod: Pod | None, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    from podguard.pods.model import public_view
    from podguard.pods.render import pod_details

    if as_json:
        _emit({**(public_view(pod) if pod is not None else {}), **(extra or {})})
    elif pod is not None:
        print(pod_details(pod))


def _load_spec(path: Path) -> PodSpec:
    from podguard.pods.spec import load_spec

    return load_spec(path)


def _ready_failure(outcome: ReadyOutcome) -> PodguardError:
    """The pod's own lines and how to look at / stop a pod left running for inspection."""
    pod = outcome.pod
    lines = [outcome.message]
    if outcome.verdict is not None:
        lines += [f"  | {line}" for line in outcome.verdict.lines]
    lines.append(
        f"  the pod is left running for inspection: `podguard pod logs {pod.name}`; "
        f"stop it with `podguard pod stop {pod.name}` or remove it with `podguard pod down {pod.name}`"
    )
    return PodguardError("\n".join(lines), outcome.code)


def _tuning() -> Tuning:
    from podguard.pods.tuning import Tuning

    return Tuning.from_env()


# -- commands --------------------------------------------------------------------------------------------
@pod_app.command("up")
def up(
    spec_file: SpecFile,
    as_json: Json = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            envvar="PODGUARD_TIMEOUT",
            min=0.0,
            help="Seconds to wait (default: the spec's ready.timeout_s).",
        ),
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", envvar="PODGUARD_NO_WAIT", help="Return once the pod exists.")
    ] = False,
    api: Api = None,
    retry_for: RetryFor = 60.0,
) -> None:
    """Create the spec's pod (idempotent by name), then wait until it runs and its preflight passed."""
    from podguard.pods.up import pod_up

    spec = _load_spec(spec_file)  # every check before the first request
    tuning = _tuning()
    client = _api(api, retry_for, spec=spec)
    progress = _progress()
    timeout_s = spec.ready_timeout_s if timeout is None else timeout
    if spec.interruptible:
        progress.say("spot pods exist only through GraphQL (REST v2 has none): creating it through the runpod SDK")
    if spec.cluster is not None:
        from podguard.pods.clusters import commands

        commands.up(
            client, spec, timeout_s=timeout_s, wait=not no_wait, as_json=as_json, tuning=tuning, progress=progress
        )
        return
    result = pod_up(
        client,
        spec,
        timeout_s=timeout_s,
        wait=not no_wait,
        tuning=tuning,
        progress=progress,
    )
    progress.close()
    outcome = result.outcome
    extra: dict[str, Any] = {"action": result.action, "ready": None if outcome is None else outcome.code == 0}
    if outcome is not None and outcome.verdict is not None:
        extra["verdict"] = outcome.verdict.word
        extra["preflight"] = outcome.verdict.lines
    _show(result.pod, as_json, extra)
    if outcome is not None and outcome.code != ExitCode.OK:
        raise _ready_failure(outcome)


@pod_app.command("status")
def status(pod: PodRef, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """One pod or cluster: status, GPU, cost per hour, SSH command, ports (a cluster: each node too), its keeper."""
    from podguard.pods.keeper.deploy import kept_by

    client, target = _client_and_pod(api, retry_for, pod)
    kept = kept_by(client, target.name)
    if _is_cluster(target):
        from podguard.pods.clusters import commands

        commands.show(client, target, as_json=as_json, extra={"kept_by": kept})
    else:
        _show(target, as_json, {"kept_by": kept})
    if kept and not as_json:
        print(f"kept by:  {kept} (`podguard pod keep`)")


@pod_app.command("list")
def list_(as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Every pod of the account and one item per cluster, as a table or a JSON array."""
    from podguard.pods.clusters import commands

    commands.list_all(_api(api, retry_for), as_json=as_json)


@pod_app.command("logs")
def logs(
    pod: PodRef,
    follow: Annotated[bool, typer.Option("--follow", "-f", envvar="PODGUARD_FOLLOW", help="Keep streaming.")] = False,
    tail: Annotated[
        int, typer.Option("--tail", envvar="PODGUARD_TAIL", min=0, max=5000, help="Recent lines to show.")
    ] = 100,
    node: Annotated[
        int | None,
        typer.Option("--node", envvar="PODGUARD_NODE", min=0, help="A cluster's node rank: only that node's lines."),
    ] = None,
    as_json: Json = False,
    api: Api = None,
    retry_for: RetryFor = 60.0,
) -> None:
    """The pod's recent log lines (`--tail N`); `--follow` keeps streaming until interrupted.

    For a cluster, every node's lines prefixed `node<R>: ` (or one node's with `--node R`)."""
    from podguard.pods.follow import LogFollower, print_logs

    client, target = _client_and_pod(api, retry_for, pod)
    tuning = _tuning()
    if _is_cluster(target):
        from podguard.pods.clusters import commands

        try:
            commands.logs(client, target, node=node, tail=tail, follow=follow, as_json=as_json, tuning=tuning)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return
    if node is not None:
        raise UsageError(f"--node {node} applies to clusters only; {target.name} is a pod")
    follower = LogFollower(client, target.id, since=None, tail=tail, backoff_s=tuning.backoff_s)
    try:
        print_logs(
            follower, follow=follow, tail=tail, idle_s=tuning.logs_idle_s, emit=lambda e: _print_event(e, as_json)
        )
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _print_event(event: Any, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(event)), flush=True)
    else:
        print(event.line, flush=True)


@pod_app.command("wait")
def wait(
    pod: PodRef,
    timeout: Annotated[float, typer.Option("--timeout", envvar="PODGUARD_TIMEOUT", min=0.0, help="Seconds.")] = 1800.0,
    as_json: Json = False,
    api: Api = None,
    retry_for: RetryFor = 60.0,
) -> None:
    """Wait until the pod runs and its preflight passed (76 when it failed, 75 on timeout)."""
    from podguard.pods.readiness import wait_ready

    client, target = _client_and_pod(api, retry_for, pod)
    progress = _progress()
    if _is_cluster(target):
        from podguard.pods.clusters import commands

        commands.wait(client, target, timeout_s=timeout, as_json=as_json, tuning=_tuning(), progress=progress)
        return
    outcome = wait_ready(client, target.id, timeout_s=timeout, tuning=_tuning(), progress=progress)
    progress.close()
    _show(
        outcome.pod, as_json, {"ready": outcome.code == 0, "verdict": outcome.verdict.word if outcome.verdict else None}
    )
    if outcome.code != ExitCode.OK:
        raise _ready_failure(outcome)


def _lifecycle(ref: str, action: str, as_json: bool, api: str | None, retry_for: float) -> None:
    from podguard.pods.actions import act_on
    from podguard.pods.clusters.target import find_target
    from podguard.pods.model import PodAction

    wanted = PodAction(action)
    client = _api(api, retry_for)
    target = find_target(client, ref, missing_ok=wanted is PodAction.TERMINATE)
    if target is None:
        print(f"podguard: no pod or cluster named {ref!r} or with that id: nothing to take down", file=sys.stderr)
        if as_json:
            _emit({"changed": False, "terminated": True})
        return
    from podguard.pods.clusters import commands
    from podguard.pods.clusters.model import Member

    if wanted is PodAction.TERMINATE and not isinstance(target, Member):
        from podguard.pods.keeper.deploy import end_keepers

        end_keepers(client, target.name, lambda text: print(f"podguard: {text}", file=sys.stderr))  # first
    if _is_cluster(target):
        if wanted is not PodAction.TERMINATE:
            raise commands.refuse_action(target, wanted)
        commands.down(client, target, as_json=as_json)
        return
    if isinstance(target, Member):
        result = commands.act_on_member(client, target, wanted)
    else:
        result = act_on(client, target, wanted)
    print(f"podguard: {result.message}", file=sys.stderr)
    if as_json:
        _show(result.pod, True, {"changed": result.changed, "terminated": result.pod is None})
    elif result.pod is not None:
        print(f"{result.pod.id}  {result.pod.status}")


@pod_app.command("stop")
def stop(pod: PodRef, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Stop the pod (keeps its disk; a stopped pod is pinned to its host). Stopping an EXITED pod is success."""
    _lifecycle(pod, "stop", as_json, api, retry_for)


@pod_app.command("start")
def start(pod: PodRef, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Start a stopped pod (69 when its host has no free GPUs: `pod heal --replace` moves it)."""
    _lifecycle(pod, "start", as_json, api, retry_for)


@pod_app.command("restart")
def restart(pod: PodRef, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Restart a RUNNING pod's container in place."""
    _lifecycle(pod, "restart", as_json, api, retry_for)


@pod_app.command("down")
def down(pod: PodRef, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Terminate the pod (its network volume stays). A pod that is already gone is success."""
    _lifecycle(pod, "terminate", as_json, api, retry_for)


@template_app.command("push")
def template_push(spec_file: SpecFile, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Create or update the template (named by the spec's `template`, else its `name`) for this image."""
    spec = _load_spec(spec_file)
    request = spec.template_request()
    tid, created = _api(api, retry_for).upsert_template(request)
    verb = "created" if created else "updated"
    if as_json:
        _emit({"id": tid, "name": request.name, "created": created})
    else:
        print(f"template {request.name} ({tid}) {verb}: image {request.image}, args {request.args!r}")

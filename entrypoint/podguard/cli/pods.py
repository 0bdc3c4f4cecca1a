"""`podguard pod …` and `podguard template push`: RunPod pods from a laptop, thin commands over podguard.pods.

Registered only when the first argument is `pod` or `template` (or for the full help). Nothing here
imports an API client before a command runs, and only `--api graphql` / spot specs load the `runpod` SDK.
Exit codes (docs/running-pods.md): 64 bad spec/arguments or an action the status does not allow, 66 no such pod,
69 no capacity, 75 transient API failure or a wait timed out, 76 the pod's preflight failed, 77 key/account.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from podguard import console
from podguard.cli import pod_recovery  # noqa: F401 (its commands, heal and keep, join pod_app)
from podguard.cli.pod_common import (
    Adopt,
    Api,
    Json,
    PodRef,
    RetryFor,
    SpecFile,
    api_client,
    client_and_pod,
    emit,
    is_cluster,
    pod_app,
    pod_tuning,
    show,
    template_app,
)
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.pods.clusters.cluster import Member
from podguard.pods.pod import PodAction

if TYPE_CHECKING:
    from podguard.pods.readiness import ReadyOutcome
    from podguard.pods.spec import PodSpec

__all__ = ["pod_app", "register", "template_app"]


def register(app: typer.Typer, only: str | None = None) -> None:
    if only in (None, "pod"):
        app.add_typer(pod_app, name="pod")
    if only in (None, "template"):
        app.add_typer(template_app, name="template")


# -- helpers ----------------------------------------------------------------------------------------------
def _load_spec(path: Path) -> PodSpec:
    from podguard.pods.spec import load_spec  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    return load_spec(path)


def _adopt_ids(raw: list[str] | None) -> tuple[str, ...]:
    """`--adopt ID` (repeatable, or comma-separated in PODGUARD_ADOPT): ids, checked before any request."""
    ids = tuple(i.strip() for item in raw or () for i in item.split(",") if i.strip())
    for pod_id in ids:
        if any(c.isspace() for c in pod_id) or len(pod_id) > 100:
            raise UsageError(f"--adopt {pod_id!r} is not valid; expected the id of a pod (cluster) of the spec's name")
    return ids


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
    adopt: Adopt = None,
) -> None:
    """Create the spec's pod (idempotent by name), then wait until it runs and its preflight passed."""
    from podguard.pods.up import pod_up  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    spec = _load_spec(spec_file)  # every check before the first request
    adopted = _adopt_ids(adopt)
    tuning = pod_tuning()
    client = api_client(api, retry_for, spec=spec)
    timeout_s = spec.ready_timeout_s if timeout is None else timeout
    if spec.interruptible:
        console.say("spot pods exist only through GraphQL (REST v2 has none): creating it through the runpod SDK")
    if spec.cluster is not None:
        from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

        commands.up(
            client,
            spec,
            timeout_s=timeout_s,
            wait=not no_wait,
            as_json=as_json,
            tuning=tuning,
            adopt=adopted,
        )
        return
    result = pod_up(
        client,
        spec,
        timeout_s=timeout_s,
        wait=not no_wait,
        tuning=tuning,
        adopt=adopted,
    )
    console.settle()
    outcome = result.outcome
    extra: dict[str, Any] = {"action": result.action, "ready": None if outcome is None else outcome.code == 0}
    if outcome is not None and outcome.verdict is not None:
        extra["verdict"] = outcome.verdict.word
        extra["preflight"] = outcome.verdict.lines
    show(result.pod, as_json, extra)
    if outcome is not None and outcome.code != ExitCode.OK:
        raise _ready_failure(outcome)


@pod_app.command("status")
def status(pod: PodRef, as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """One pod or cluster: status, GPU, cost per hour, SSH command, ports (a cluster: each node too), its keeper."""
    from podguard.pods.keeper.deploy import kept_by  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    client, target = client_and_pod(api, retry_for, pod)
    kept = kept_by(client, target.name)
    extra = {"kept_by": kept.by(), "keeper": kept.view()}
    if is_cluster(target):
        from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

        commands.show(client, target, as_json=as_json, extra=extra)
    else:
        show(target, as_json, extra)
    line = kept.line()
    if line and not as_json:
        print(f"kept by:  {line} (`podguard pod keep`)")


@pod_app.command("list")
def list_(as_json: Json = False, api: Api = None, retry_for: RetryFor = 60.0) -> None:
    """Every pod of the account and one item per cluster, as a table or a JSON array."""
    from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    commands.list_all(api_client(api, retry_for), as_json=as_json)


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
    from podguard.pods.follow import LogFollower, print_logs  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    client, target = client_and_pod(api, retry_for, pod)
    tuning = pod_tuning()
    if is_cluster(target):
        from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

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
    from podguard.pods.readiness import wait_ready  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    client, target = client_and_pod(api, retry_for, pod)
    if is_cluster(target):
        from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

        commands.wait(client, target, timeout_s=timeout, as_json=as_json, tuning=pod_tuning())
        return
    outcome = wait_ready(client, target.id, timeout_s=timeout, tuning=pod_tuning())
    console.settle()
    show(
        outcome.pod, as_json, {"ready": outcome.code == 0, "verdict": outcome.verdict.word if outcome.verdict else None}
    )
    if outcome.code != ExitCode.OK:
        raise _ready_failure(outcome)


def _lifecycle(ref: str, action: str, as_json: bool, api: str | None, retry_for: float) -> None:
    from podguard.pods.actions import act_on  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.clusters.target import find_target  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.keeper.deploy import say_unkept  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    wanted = PodAction(action)
    client = api_client(api, retry_for)
    if wanted in (PodAction.TERMINATE, PodAction.STOP):  # the user's word: written, keepers ended, swept
        from podguard.pods.keeper.down import down_or_stop  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

        down_or_stop(client, ref, wanted, as_json=as_json, emit=emit)
        return
    target = find_target(client, ref)
    if is_cluster(target):
        raise commands.refuse_action(target, wanted)
    if isinstance(target, Member):
        result = commands.act_on_member(client, target, wanted)
    else:
        assert target is not None
        result = act_on(client, target, wanted)
    console.say(result.message)
    if wanted is PodAction.START and not isinstance(target, Member):
        say_unkept(client, target.name)
    if as_json:
        show(result.pod, True, {"changed": result.changed, "terminated": result.pod is None})
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
    tid, created = api_client(api, retry_for).upsert_template(request)
    verb = "created" if created else "updated"
    if as_json:
        emit({"id": tid, "name": request.name, "created": created})
    else:
        print(f"template {request.name} ({tid}) {verb}: image {request.image}, args {request.args!r}")

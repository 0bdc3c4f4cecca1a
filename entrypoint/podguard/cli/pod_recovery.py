"""`podguard pod heal` and `podguard pod keep`: the pod commands that recover what broke (cli/pods.py has the
rest and the shared options; its `register` imports this module so that these commands join `pod_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from podguard import console
from podguard.cli.pod_common import (
    Adopt,
    Api,
    Json,
    PodRef,
    RetryFor,
    api_client,
    client_and_pod,
    is_cluster,
    pod_app,
    pod_tuning,
    show,
)
from podguard.errors import ExitCode, PodguardError

if TYPE_CHECKING:
    from podguard.pods.api import PodApi
    from podguard.pods.clusters.cluster import Cluster


@pod_app.command("heal")
def heal(
    pod: PodRef,
    replace: Annotated[
        bool, typer.Option("--replace", envvar="PODGUARD_REPLACE", help="Last step: replace it on another machine.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", envvar="PODGUARD_TIMEOUT", min=0.0, help="Seconds per step.")
    ] = 900.0,
    as_json: Json = False,
    api: Api = None,
    retry_for: RetryFor = 60.0,
) -> None:
    """Restart, then stop+start (fresh driver state), then with --replace an identical pod elsewhere."""
    from podguard.pods.heal import heal as run_heal  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.heal import heal_record  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    client, target = client_and_pod(api, retry_for, pod, member_as_cluster=True)
    if is_cluster(target):
        _heal_cluster(client, target, replace, timeout, as_json)
        return
    result = run_heal(client, target, replace=replace, timeout_s=timeout, tuning=pod_tuning())
    console.settle()
    record = heal_record(target, result)
    _note_heal_record(target.id, record)
    show(result.pod, as_json, {"heal": record})
    if result.code != ExitCode.OK:
        lines = [result.message, *[f"  | {line}" for line in result.lines]]
        raise PodguardError("\n".join(lines), result.code)


def _heal_cluster(client: PodApi, cluster: Cluster, replace: bool, timeout: float, as_json: bool) -> None:
    from podguard.pods.clusters import commands  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    try:
        record = commands.heal(
            client, cluster, replace=replace, timeout_s=timeout, as_json=as_json, tuning=pod_tuning()
        )
    except commands.HealFailed as failed:
        _note_heal_record(cluster.id, failed.record)
        raise
    _note_heal_record(cluster.id, record)


def _note_heal_record(target_id: str, record: dict[str, Any]) -> None:
    from podguard.pods.heal import save_heal_record  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    where = save_heal_record(target_id, record)
    if where:
        console.say(f"heal record: {where}")


@pod_app.command("keep")
def keep(
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec", envvar="PODGUARD_SPEC", help="The pod spec (TOML), e.g. runpod/pod.toml.", show_default=False
        ),
    ] = None,
    poll: Annotated[
        str, typer.Option("--poll", envvar="PODGUARD_POLL", help="Seconds between status requests (one each).")
    ] = "30",
    max_recoveries: Annotated[
        str,
        typer.Option(
            "--max-recoveries",
            envvar="PODGUARD_MAX_RECOVERIES",
            help="Starts and replacements at most; then leave it stopped and exit 75.",
        ),
    ] = "5",
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            envvar="PODGUARD_NOTIFY",
            help="Webhook URL: a JSON post (text and content: Slack, Discord) per recovery, the end, a give-up.",
            show_default=False,
        ),
    ] = None,
    deploy: Annotated[
        bool,
        typer.Option("--deploy", envvar="PODGUARD_DEPLOY", help="Run the keeper as a small CPU pod (<name>-keeper)."),
    ] = False,
    key_secret: Annotated[
        str | None,
        typer.Option(
            "--key-secret",
            envvar="PODGUARD_KEY_SECRET",
            help="With --deploy: the RunPod secret holding the API key (default runpod_api_key).",
            show_default=False,
        ),
    ] = None,
    as_json: Json = False,
    api: Api = None,
    retry_for: RetryFor = 60.0,
    adopt: Adopt = None,
) -> None:
    """`pod up`, then watch the pod (or cluster) and its job until it is over, recovering what breaks."""
    from podguard.pods.keeper.command import KeepRequest  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.keeper.command import keep as run_keep  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    adopted = tuple(i.strip() for item in adopt or () for i in item.split(",") if i.strip())
    request = KeepRequest(spec_file, poll, max_recoveries, notify, deploy, key_secret, as_json, adopted)
    code = run_keep(request, lambda spec: api_client(api, retry_for, spec=spec))
    if code:
        raise typer.Exit(code)

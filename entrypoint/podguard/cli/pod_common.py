"""What the `podguard pod …` command modules share: the Typer apps, the common options and the small helpers.

cli/pods.py (the everyday pod commands) and cli/pod_recovery.py (`heal`, `keep`) both import this module; neither
imports the other's commands (pods.register imports pod_recovery only to register its commands on `pod_app`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeGuard

import typer

from podguard.errors import UsageError

if TYPE_CHECKING:
    from podguard.pods.api import PodApi
    from podguard.pods.clusters.cluster import Cluster
    from podguard.pods.pod import Pod
    from podguard.pods.spec import PodSpec
    from podguard.pods.tuning import Tuning

__all__ = [
    "Adopt",
    "Api",
    "Json",
    "PodRef",
    "RetryFor",
    "SpecFile",
    "api_client",
    "client_and_pod",
    "emit",
    "is_cluster",
    "pod_app",
    "pod_tuning",
    "show",
    "template_app",
]

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
Adopt = Annotated[
    list[str] | None,
    typer.Option(
        "--adopt",
        envvar="PODGUARD_ADOPT",
        help="Hand a pod (cluster) of the spec's name that podguard did not make over to podguard (its id).",
        show_default=False,
    ),
]
SpecFile = Annotated[
    Path, typer.Option("--spec", envvar="PODGUARD_SPEC", help="The pod spec (TOML), e.g. runpod/pod.toml.")
]


# -- helpers ---------------------------------------------------------------------------------------------
def api_client(kind: str | None, retry_for: float, *, spec: PodSpec | None = None) -> PodApi:
    from podguard.pods.api import ApiKind, open_api  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

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


def client_and_pod(
    kind: str | None, retry_for: float, ref: str, *, member_as_cluster: bool = False
) -> tuple[PodApi, Pod | Cluster]:
    """An API client and the pod or cluster named `ref` (by id or name); exit 66 when there is none.

    A cluster member's id names that node's pod, or its cluster with `member_as_cluster` (heal)."""
    from podguard.pods.clusters.cluster import Member  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.clusters.rest import cluster_api  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.clusters.target import find_target  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    client = api_client(kind, retry_for)
    target = find_target(client, ref)
    assert target is not None  # find_target raises NOT_FOUND (66) unless missing_ok
    if isinstance(target, Member):
        if member_as_cluster and target.cluster_id:
            return client, cluster_api(client).get_cluster(target.cluster_id)
        return client, target.pod
    return client, target


def is_cluster(target: object) -> TypeGuard[Cluster]:
    from podguard.pods.clusters.cluster import Cluster  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    return isinstance(target, Cluster)


def emit(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


def show(pod: Pod | None, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    from podguard.pods.pod import public_view  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.pods.render import pod_details  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    if as_json:
        emit({**(public_view(pod) if pod is not None else {}), **(extra or {})})
    elif pod is not None:
        print(pod_details(pod))


def pod_tuning() -> Tuning:
    from podguard.pods.tuning import Tuning  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    return Tuning.from_env()

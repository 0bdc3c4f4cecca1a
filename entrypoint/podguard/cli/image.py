"""`podguard image build|run|smoke`: podguard's container image on a Docker host, through the Docker SDK.

Registered only when the first argument is `image` (or for the full help), so no other command imports
this module, and nothing here imports the SDK before a command runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError

if TYPE_CHECKING:
    import docker

    from podguard.image.run import RunResult

image_app = typer.Typer(
    name="image",
    help="Build, run (the way RunPod would) and smoke-test podguard's container image on a Docker host.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Json = Annotated[bool, typer.Option("--json", envvar="PODGUARD_JSON", help="Print machine-readable JSON.")]


def register(app: typer.Typer, only: str | None = None) -> None:
    if only in (None, "image"):
        app.add_typer(image_app, name="image")


def _emit(payload: dict[str, object]) -> None:
    json.dump(payload, sys.stdout, indent=2, default=str)
    print()


@image_app.command("build")
def build(
    base: Annotated[
        str | None,
        typer.Option("--base", envvar="PODGUARD_BASE", help="Base image (default: the Dockerfile's BASE_IMAGE)."),
    ] = None,
    torch: Annotated[
        str | None,
        typer.Option(
            "--torch",
            envvar="PODGUARD_TORCH",
            help="pip requirement for torch, e.g. torch==2.13.0 (default: docker/build-wheelhouse.sh's), or "
            "`base`: use the base image's own Python and torch (podguard adds at most 30 MB).",
        ),
    ] = None,
    tag: Annotated[str, typer.Option("--tag", envvar="PODGUARD_TAG", help="Image name[:tag].")] = "podguard:latest",
    python: Annotated[
        str | None,
        typer.Option(
            "--python", envvar="PODGUARD_PYTHON", help="The image's Python X.Y (default: read from the base)."
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source", envvar="PODGUARD_SOURCE", help="Repository URL for the source label (default: git remote)."
        ),
    ] = None,
    context: Annotated[
        Path | None,
        typer.Option("--context", envvar="PODGUARD_CONTEXT", help="The podguard checkout (default: found from CWD)."),
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", envvar="PODGUARD_NO_CACHE", help="Ignore Docker's layer cache.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Build the image (wheelhouse on the host, then the Dockerfile); tags TAG, VERSION, VERSION-REVISION."""
    from podguard.image.build import plan_build, run_build, split_reference  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.engine import connect  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.source import default_base, find_checkout, source_metadata  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.wheelhouse import build_wheelhouse, image_python  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    split_reference(tag)  # a bad tag fails before any work
    if python is not None and not python.replace(".", "", 1).isdigit():
        raise UsageError(f"--python {python!r} is not valid; expected a version such as 3.12")
    torch_base = torch == "base"
    if torch_base and python is not None:
        raise UsageError("--python cannot be combined with --torch base: the base's own python3 is used")
    root = find_checkout(context or Path.cwd())
    base = base or default_base(root)
    client = connect()
    if torch_base:
        python = _base_python(client, base)
    else:
        python = python or image_python(client, base)
        console.line(f"podguard image build: base {base}, Python {python}, torch {torch or 'default'}")
    build_wheelhouse(root, python=python, torch_spec=torch)
    meta = source_metadata(root, source)
    plan = plan_build(root, base=base, tag=tag, meta=meta, nocache=no_cache, torch_base=torch_base)
    result = run_build(client, plan)
    if as_json:
        console.line(_added_line(result.added_bytes, base, torch_base))  # "podguard adds ...": no prefix
        _emit(asdict(result))
        return
    size_mb = result.size_bytes / 1e6
    print(f"podguard image build: built {result.image_id[:19]} in {result.seconds:.0f} s, {size_mb:.0f} MB")
    print(f"  {_added_line(result.added_bytes, base, torch_base)}")
    for name in result.tags:
        print(f"  tag {name}")


def _base_python(client: docker.DockerClient, base: str) -> str:
    """`--torch base`: the base's Python X.Y after checking it has Python >= 3.11 and torch (64 otherwise)."""
    from podguard.image.basetorch import inspect_base, require_base_torch  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    found = inspect_base(client, base)
    require_base_torch(found, base)
    console.line(
        f"podguard image build: base {base}, its Python {found.python} ({found.executable}), its torch {found.torch}"
    )
    return found.python_xy


def _added_line(added: int, base: str, torch_base: bool) -> str:
    """What the build added over the base; for `--torch base` against its 30 MB budget."""
    from podguard.image.build import TORCH_BASE_BUDGET_BYTES  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    line = f"podguard adds {added / 1e6:.1f} MB over {base}"
    if not torch_base:
        return line
    if added > TORCH_BASE_BUDGET_BYTES:
        return f"{line}: more than the {TORCH_BASE_BUDGET_BYTES / 1e6:.0f} MB budget (see the build's apt lines)"
    return f"{line} (budget {TORCH_BASE_BUDGET_BYTES / 1e6:.0f} MB)"


@image_app.command("run")
def run(
    spec: Annotated[
        Path, typer.Option("--spec", envvar="PODGUARD_SPEC", help="The pod spec (TOML), e.g. runpod/pod.toml.")
    ],
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            envvar="PODGUARD_GPUS",
            help="all | N (the first N) | LIST (0,1 or device=1) | none. Default: all for a [gpu] spec.",
        ),
    ] = None,
    image: Annotated[
        str | None, typer.Option("--image", envvar="PODGUARD_IMAGE", help="Run this image instead of the spec's.")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", envvar="PODGUARD_ENV", help="NAME=VALUE added to the pod's env (repeatable)."),
    ] = None,
    bind: Annotated[
        str, typer.Option("--bind", envvar="PODGUARD_BIND", help="Host address the pod's ports are published on.")
    ] = "127.0.0.1",
    force: Annotated[
        bool,
        typer.Option(
            "--force", envvar="PODGUARD_FORCE", help="Also stop containers podguard did not start that hold the GPUs."
        ),
    ] = False,
    as_json: Json = False,
) -> None:
    """Run a pod spec's image here the way RunPod would (env, ports, volume, pod id, SSH key, GPUs, restart).

    Replaces its own previous container; stops podguard's containers on those GPUs, others only with --force."""
    from podguard.image.engine import connect  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.gpus import parse_gpus  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.podspec import read_pod_spec  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.run import RunRequest, run_pod  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    wanted = parse_gpus(gpus) if gpus is not None else None
    extra = {}
    for item in env or []:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--env {item!r} is not valid; expected NAME=VALUE")
        extra[name] = value
    request = RunRequest(spec=read_pod_spec(spec), gpus=wanted, image=image, env=extra, bind=bind, force=force)
    result = run_pod(connect(), request)
    for note in result.notes:
        console.line(f"podguard image run: note: {note}")
    if as_json:
        _emit(asdict(result))
        return
    _print_run(result, request.spec.volume_path)


@image_app.command("smoke")
def smoke(
    image: Annotated[str, typer.Argument(help="The image to check, e.g. podguard:latest.")],
    check: Annotated[
        list[str] | None,
        typer.Option("--check", envvar="PODGUARD_CHECK", help="Run only this check (repeatable); default: all."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Quick checks of a built image, timed: --version, doctor --json, the demo train, docker stop."""
    from podguard.image.engine import connect, require_image  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.image.smoke import render_check, render_smoke, run_smoke  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    client = connect()
    require_image(client, image)
    show = None if as_json else lambda c: print(render_check(c), flush=True)
    report = run_smoke(client, image, on_check=show, only=tuple(check or ()))
    if as_json:
        _emit(report.as_dict())
    else:
        print(render_smoke(report))
    if not report.ok:
        raise PodguardError(
            f"image {image} failed {sum(not c.ok for c in report.checks)} smoke check(s)", ExitCode.FAILURE
        )


def _print_run(result: RunResult, volume_path: str | None) -> None:
    print(f"podguard image run: started {result.name} ({result.container_id[:12]}), pod id {result.pod_id}")
    print(f"  image   {result.image}  {' '.join(result.command)}")
    print(f"  gpus    {result.gpus}")
    print(f"  volume  {result.volume or 'none'}{' at ' + volume_path if volume_path else ''}")
    for port, where in result.ports.items():
        host, _, number = where.rpartition(":")
        hint = f"  (ssh root@{host} -p {number})" if port == "22/tcp" else ""
        print(f"  port    {port} -> {where}{hint}")
    if result.replaced:
        print(f"  replaced its previous container {result.replaced}")
    print("  restart when its command exits (stop: docker stop " + result.name + ")")
    print(f"  logs    docker logs -f {result.name}")

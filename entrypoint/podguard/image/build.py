"""`podguard image build`: the wheelhouse on the host, then the Dockerfile through the Docker SDK.

    plan = plan_build(root, base="podguard-test-base:bookworm", tag="podguard-test:latest", meta=source_metadata(root))
    result = run_build(connect(), plan)   # the transcript: console lines

`--torch base` (`plan_build(..., torch_base=True)`) builds docker/torch-base.Dockerfile: the base's own
Python and torch, podguard added on top (image/basetorch.py reads the base first). Either way the result
says how many bytes the build added over the base (`added_bytes`): podguard's layers.

Tags: the one asked for, plus `<repository>:<version>` and `<repository>:<version>-<revision>`. Build
arguments are exactly the base and the label values (version, revision, source): nothing from the
environment is passed, so no secret of the build machine can reach `docker history` or a layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.image.build_progress import BuildPrinter
from podguard.image.context import BuildContext
from podguard.image.engine import engine_error
from podguard.image.source import SourceMetadata

if TYPE_CHECKING:
    import docker

__all__ = ["TORCH_BASE_BUDGET_BYTES", "BuildPlan", "BuildResult", "plan_build", "run_build", "split_reference"]

TORCH_BASE_BUDGET_BYTES = 30_000_000  # what `--torch base` may add over the base (docs/image.md: 30 MB)

_TAG_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass(frozen=True)
class BuildPlan:
    root: Path
    base: str
    tags: tuple[str, ...]  # the first is the one asked for
    buildargs: dict[str, str] = field(default_factory=dict)
    nocache: bool = False
    torch_base: bool = False  # the base brings Python and torch (docker/torch-base.Dockerfile)


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    size_bytes: int
    base_size_bytes: int
    added_bytes: int  # size_bytes - base_size_bytes: what podguard's layers add
    seconds: float
    steps: int
    cached_steps: int


def split_reference(reference: str) -> tuple[str, str]:
    """`registry:5000/me/podguard:dev` -> (`registry:5000/me/podguard`, `dev`); no tag -> `latest`."""
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        name, tag = reference, "latest"
    if not name or not tag or len(tag) > 128 or not set(tag) <= _TAG_CHARS or tag[0] in ".-" or name != name.lower():
        raise UsageError(
            f"--tag {reference!r} is not a valid image reference; expected NAME[:TAG], e.g. podguard:dev "
            "(lowercase name; tag of letters, digits, _ . -)"
        )
    return name, tag


def plan_build(
    root: Path, *, base: str, tag: str, meta: SourceMetadata, nocache: bool = False, torch_base: bool = False
) -> BuildPlan:
    repository, _ = split_reference(tag)
    tags = [tag if ":" in tag.rsplit("/", 1)[-1] else f"{tag}:latest", f"{repository}:{meta.version}"]
    if meta.revision != "unknown":
        tags.append(f"{repository}:{meta.version}-{meta.revision}")
    buildargs = {"BASE_IMAGE": base, "PODGUARD_VERSION": meta.version, "PODGUARD_REVISION": meta.revision}
    if meta.source:
        buildargs["PODGUARD_SOURCE"] = meta.source
    return BuildPlan(root, base, tuple(dict.fromkeys(tags)), buildargs, nocache, torch_base)


def run_build(client: docker.DockerClient, plan: BuildPlan) -> BuildResult:
    """Send the context, show the engine's progress (console lines), tag the image; one line on failure."""
    from docker.errors import DockerException  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    context = BuildContext.collect(plan.root, torch_base=plan.torch_base)
    printer = BuildPrinter()
    console.line(f"building {plan.tags[0]} on {plan.base} from {context.dockerfile} ({len(context.files)} files)")
    try:
        events = client.api.build(
            fileobj=context.stream(printer.upload),
            custom_context=True,
            dockerfile=context.dockerfile,
            tag=plan.tags[0],
            buildargs=plan.buildargs,
            nocache=plan.nocache,
            rm=True,
            forcerm=True,
            decode=True,
        )
        for event in events:
            printer.event(event)
        if printer.image_id is None:
            raise PodguardError("the engine ended the build without an image id", ExitCode.FAILURE)
        for extra in plan.tags[1:]:
            repository, tag = split_reference(extra)
            client.api.tag(printer.image_id, repository, tag)
        size = int(client.images.get(printer.image_id).attrs.get("Size", 0))
        base_size = int(client.images.get(plan.base).attrs.get("Size", 0))
    except DockerException as exc:
        raise engine_error(exc, f"building {plan.tags[0]}") from None
    return BuildResult(
        image_id=printer.image_id,
        tags=plan.tags,
        size_bytes=size,
        base_size_bytes=base_size,
        added_bytes=size - base_size,
        seconds=round(time.monotonic() - printer.started, 1),
        steps=printer.steps,
        cached_steps=printer.cached_steps,
    )

"""The Docker engine connection, its errors as podguard's exit codes, and what the engine can do.

    client = connect()                      # PodguardError(69) with one line when no engine answers
    if has_nvidia_runtime(client): ...      # GPUs can be given to containers

Exit codes of `podguard image ...`: 0 success; 64 bad input; 69 no Docker engine, or GPUs were asked for
and the engine cannot give any; 75 the GPUs are in use by containers podguard may not stop (`--force`);
1 (`ExitCode.FAILURE`) a build or a smoke check failed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from podguard.errors import ExitCode, PodguardError, UsageError

if TYPE_CHECKING:
    import docker

__all__ = ["connect", "engine_error", "has_nvidia_runtime", "require_image"]


def connect(timeout_s: float = 120) -> docker.DockerClient:
    """A client for the engine DOCKER_HOST names (else the local socket); 69 when none answers."""
    import docker  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra
    from docker.errors import DockerException  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except DockerException as exc:
        where = os.environ.get("DOCKER_HOST") or "the local socket (DOCKER_HOST is not set)"
        raise PodguardError(f"no Docker engine answers at {where}: {_short(exc)}", ExitCode.GPUS_MISSING) from None
    return client


def engine_error(exc: Exception, doing: str) -> PodguardError:
    """An SDK exception as one line naming what was being done (no traceback)."""
    return PodguardError(f"{doing} failed: {_short(exc)}", ExitCode.FAILURE)


def has_nvidia_runtime(client: docker.DockerClient) -> bool:
    """True when the engine has the NVIDIA runtime registered (the container toolkit is set up)."""
    info: dict[str, Any] = client.info()
    return "nvidia" in (info.get("Runtimes") or {})


def _short(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    text = str(explanation or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def require_image(client: docker.DockerClient, image: str) -> None:
    """UsageError (64) naming the image and how to build it when this Docker host does not have it."""
    from docker.errors import ImageNotFound  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    try:
        client.images.get(image)
    except ImageNotFound:
        raise UsageError(
            f"image {image!r} is not on this Docker host (build it: podguard image build --tag {image})"
        ) from None

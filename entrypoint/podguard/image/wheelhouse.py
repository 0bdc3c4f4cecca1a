"""The wheelhouse step of a build: which Python the image has, then docker/build-wheelhouse.sh on the host.

    python = image_python(client, "nvidia/cuda:13.0.2-base-ubuntu24.04")   # "3.12"
    build_wheelhouse(root, python=python, torch_spec="torch==2.13.0")

The image's Python decides which wheels to download. It is the base's own `python3` when it has one,
else the version its distribution's apt installs (the Dockerfile's `os` stage installs it), from a short
table of the bases podguard supports; `--python X.Y` overrides.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.image.engine import engine_error

if TYPE_CHECKING:
    import docker

__all__ = ["APT_PYTHON", "build_wheelhouse", "image_python", "python_from_probe"]

# (os-release ID, VERSION_ID) -> the python3 its apt installs (>= 3.11 only: podguard needs it)
APT_PYTHON: dict[tuple[str, str], str] = {
    ("ubuntu", "24.04"): "3.12",
    ("ubuntu", "25.04"): "3.13",
    ("debian", "12"): "3.11",
    ("debian", "13"): "3.13",
}
_PROBE = (
    "v=$(python3 -c \"import sys; print('%d.%d' % sys.version_info[:2])\" 2>/dev/null); "
    'echo "python=$v"; . /etc/os-release 2>/dev/null; echo "os=$ID $VERSION_ID"'
)


def python_from_probe(output: str, base: str) -> str:
    """The image's Python from the probe's `python=X.Y` / `os=ID VERSION` lines."""
    values = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    if values.get("python"):
        return values["python"]
    distro = tuple(values.get("os", "").split()[:2])
    if distro in APT_PYTHON:
        return APT_PYTHON[distro]  # type: ignore[index]
    known = ", ".join(f"{d} {v}" for d, v in APT_PYTHON)
    raise UsageError(
        f"cannot tell which Python {base} will have (no python3; distribution {' '.join(distro) or 'unknown'} "
        f"is not one of: {known}); pass --python X.Y"
    )


def image_python(client: docker.DockerClient, base: str) -> str:
    """Run the base once (pulling it if needed) and read its Python version."""
    from docker.errors import DockerException  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    try:
        out = client.containers.run(base, ["-c", _PROBE], entrypoint=["/bin/sh"], remove=True, network_disabled=True)
    except DockerException as exc:
        raise engine_error(exc, f"inspecting the base image {base}") from None
    return python_from_probe(out.decode(errors="replace"), base)


def build_wheelhouse(root: Path, *, python: str, torch_spec: str | None) -> None:
    """docker/build-wheelhouse.sh with this interpreter's pip; its output goes to stderr as it comes."""
    env = {**os.environ, "PIP": f"{sys.executable} -m pip", "IMAGE_PYTHON": python}
    if torch_spec:
        env["TORCH_SPEC"] = torch_spec
    proc = subprocess.run([str(root / "docker" / "build-wheelhouse.sh")], cwd=root, env=env, stdout=sys.stderr)
    if proc.returncode != 0:
        raise PodguardError(f"the wheelhouse step failed (exit {proc.returncode}; see above)", ExitCode.FAILURE)

"""`--torch base`: what the base image's own Python and torch are, read before anything is built.

    found = inspect_base(client, "runpod/pytorch:...")   # BaseTorch(python="3.11", torch="2.13.0+cpu", ...)
    require_base_torch(found, base)                      # UsageError (64) naming what is missing

One short container of the base (network off, removed) runs `python3 -c ...` through `/bin/sh`, so the
`python3` is the one the base's PATH puts first, as it will be for the build and for the training command.
The probe never imports torch (seconds on a CUDA build): it reads torch's installed version (its metadata)
and checks that the module is there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from podguard.errors import UsageError
from podguard.image.engine import engine_error

if TYPE_CHECKING:
    import docker

__all__ = ["MIN_PYTHON", "BaseTorch", "inspect_base", "parse_probe", "require_base_torch"]

MIN_PYTHON = (3, 11)
# Valid in any Python 3 (the point is to report an old one, not to fail on it).
_PY = (
    "import sys\n"
    "print('python=%d.%d.%d' % sys.version_info[:3])\n"
    "print('executable=' + sys.executable)\n"
    "try:\n"
    "    import importlib.util\n"
    "    found = importlib.util.find_spec('torch') is not None\n"
    "except Exception:\n"
    "    found = False\n"
    "version = ''\n"
    "if found:\n"
    "    try:\n"
    "        from importlib.metadata import version as v\n"
    "        version = v('torch')\n"
    "    except Exception:\n"
    "        version = 'unknown version'\n"
    "print('torch=' + version)\n"
)
_SH = 'command -v python3 >/dev/null 2>&1 || { echo python=; exit 0; }; exec python3 -c "$0"'


@dataclass(frozen=True)
class BaseTorch:
    python: str  # "3.11.7"; "" when the base has no python3 on PATH
    executable: str  # the interpreter's path, e.g. /opt/conda/bin/python3
    torch: str  # torch's version, e.g. "2.13.0+cpu"; "" when torch is not importable

    @property
    def python_xy(self) -> str:
        return ".".join(self.python.split(".")[:2])


def parse_probe(output: str) -> BaseTorch:
    values = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    return BaseTorch(
        python=values.get("python", "").strip(),
        executable=values.get("executable", "").strip(),
        torch=values.get("torch", "").strip(),
    )


def inspect_base(client: docker.DockerClient, base: str) -> BaseTorch:
    """Run the probe in a container of `base` (pulled if needed); 64 when the base cannot run it."""
    from docker.errors import ContainerError, DockerException, ImageNotFound  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    try:
        out = client.containers.run(
            base, [_PY], entrypoint=["/bin/sh", "-c", _SH], user="root", remove=True, network_disabled=True
        )
    except ContainerError as exc:
        raise UsageError(f"--torch base: cannot run python3 in {base}: {str(exc.stderr or exc)[-200:]}") from None
    except ImageNotFound:
        raise UsageError(f"--torch base: no image {base!r} on this Docker host or its registry") from None
    except DockerException as exc:
        if "executable file not found" in str(exc) or "no such file" in str(exc).lower():
            raise UsageError(f"--torch base: {base} has no /bin/sh to inspect it with") from None
        raise engine_error(exc, f"inspecting the base image {base}") from None
    return parse_probe(out.decode(errors="replace"))


def require_base_torch(found: BaseTorch, base: str) -> None:
    """UsageError (64), one line, when the base has no python3, an older one than 3.11, or no torch."""
    if not found.python:
        raise UsageError(
            f"--torch base: {base} has no python3 on its PATH; use a base with Python >= 3.11 and torch, "
            "or build with --torch SPEC (podguard's own Python environment)"
        )
    version = tuple(int(p) for p in found.python.split(".")[:2] if p.isdigit())
    if version < MIN_PYTHON:
        raise UsageError(
            f"--torch base: {base}'s python3 ({found.executable}) is Python {found.python}; podguard needs >= 3.11 "
            "(use a newer base, or --torch SPEC)"
        )
    if not found.torch:
        raise UsageError(
            f"--torch base: {base}'s python3 ({found.executable}, Python {found.python}) has no torch; "
            "use a base with torch installed, or build with --torch SPEC (e.g. --torch torch==2.13.0)"
        )

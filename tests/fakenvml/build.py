"""Build the fake `libnvidia-ml.so.1` with gcc from NVML's real header.

Why a real header: the fake must match the ABI that `nvidia-ml-py` expects (struct layouts, versioned
symbols); compiling against `nvml.h` from the `nvidia-nvml-dev` wheel lets the compiler check every
signature. Builds are cached by a hash of the source, the header, the variant and the compiler command, so
repeated builds (every test session, every worker) are free, and concurrent builders never see a
half-written library (write to a temporary file, then rename).

Usage: ``python -m tests.fakenvml.build DEST [--variant old]`` prints the directory that holds
``libnvidia-ml.so.1``; point ``LD_LIBRARY_PATH`` at it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"

# "current": a recent driver (550+). "old": a driver without the newer symbols, so pynvml raises
# FunctionNotFound for them (the fake is otherwise the same).
VARIANTS: dict[str, list[str]] = {"current": [], "old": ["-DFAKE_OLD_DRIVER"]}


@dataclass(frozen=True)
class FakeNvmlBuild:
    """A built fake: `lib_dir` goes on LD_LIBRARY_PATH; `library` is the file itself (for ctypes)."""

    lib_dir: Path
    variant: str = "current"

    @property
    def library(self) -> Path:
        return self.lib_dir / LIBRARY_NAME


class FakeNvmlBuildError(RuntimeError):
    """The fake could not be built (no gcc, no header); the message says what to install."""


def find_nvml_header() -> Path:
    """Locate nvml.h in the installed `nvidia-nvml-dev` wheel.

    The wheel installs into the `nvidia` namespace package under a CUDA-major folder (`cu12`, `cu13`,
    ...) whose name changes between releases, so search every portion of the namespace instead of
    hard-coding one path. `FAKE_NVML_HEADER` overrides the search.
    """
    override = os.environ.get("FAKE_NVML_HEADER")
    if override:
        path = Path(override)
        if not path.is_file():
            raise FakeNvmlBuildError(f"FAKE_NVML_HEADER={override} is not a file")
        return path
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    candidates: list[str] = []
    for root in roots:
        candidates += glob.glob(os.path.join(root, "*", "include", "nvml.h"))
        candidates += glob.glob(os.path.join(root, "include", "nvml.h"))
        candidates += glob.glob(os.path.join(root, "**", "nvml.h"), recursive=True)
    if not candidates:
        raise FakeNvmlBuildError(
            "nvml.h not found: install the header wheel with `pip install nvidia-nvml-dev` "
            "(or set FAKE_NVML_HEADER to a copy of nvml.h)"
        )
    # Prefer the newest CUDA major if several wheels are installed.
    return Path(sorted(set(candidates))[-1])


def _compiler() -> str:
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise FakeNvmlBuildError(f"C compiler {cc!r} not found: install gcc (apt-get install gcc)")
    return cc


def _command(cc: str, header: Path, out: Path, variant: str) -> list[str]:
    return [
        cc,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-std=gnu11",
        f"-Wl,-soname,{LIBRARY_NAME}",
        "-I",
        str(header.parent),
        *VARIANTS[variant],
        "-o",
        str(out),
        str(SOURCE),
        "-lpthread",
    ]


def build_fake_nvml(dest_dir: Path, variant: str = "current") -> Path:
    """Compile the fake (once per source hash) and return the directory containing `libnvidia-ml.so.1`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    header = find_nvml_header()
    cc = _compiler()
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(header.read_bytes())
    digest.update(" ".join(_command(cc, Path("H"), Path("O"), variant)).encode())
    out_dir = Path(dest_dir) / f"{variant}-{digest.hexdigest()[:16]}"
    library = out_dir / LIBRARY_NAME
    if library.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        proc = subprocess.run(_command(cc, header, tmp, variant), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise FakeNvmlBuildError(f"gcc failed building the fake NVML:\n{proc.stderr}")
        os.replace(tmp, library)
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="cache directory for the built library")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="current")
    args = parser.parse_args(argv)
    try:
        print(build_fake_nvml(args.dest, args.variant))
    except FakeNvmlBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

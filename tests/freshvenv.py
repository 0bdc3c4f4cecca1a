"""Fresh virtual environments for tests that must see podguard as a newcomer's `pip install podguard` does:
a real interpreter with the core dependencies and nothing else (no torch, no runpod, no docker).

    python = make_venv(tmp_path / "venv")                      # `python -m venv --without-pip`, ~0.1 s
    link_requirements(python, core_requirements(), tmp_path)   # the dev venv's copies of typer, nvidia-ml-py, ...
    add_paths(python, ENTRYPOINT)                              # podguard from the checkout (or pip-install a wheel)

Dependencies are not downloaded: the closure of the given requirements is linked from this (the dev)
environment into a folder that a .pth file puts on the fresh interpreter's path, so the tests need no
package index and take a second, and a requirement podguard forgot to declare is missing there.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
ENTRYPOINT = REPO / "entrypoint"


def make_venv(dest: Path) -> Path:
    """A new venv without pip (the fast kind); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=60)
    return dest / "bin" / "python"


def site_packages(python: Path) -> Path:
    """The fresh interpreter's site-packages folder."""
    version = sysconfig.get_python_version()
    return python.parent.parent / "lib" / f"python{version}" / "site-packages"


def add_paths(python: Path, *folders: Path) -> None:
    """Put `folders` on the fresh interpreter's sys.path (a .pth file, as an editable install does)."""
    pth = site_packages(python) / "_podguard_tests.pth"
    existing = pth.read_text() if pth.exists() else ""
    pth.write_text(existing + "".join(f"{folder}\n" for folder in folders))


def core_requirements() -> list[str]:
    """podguard's core requirements, as this checkout's installed metadata declares them (no extras)."""
    return [r for r in metadata.requires("podguard") or [] if "extra ==" not in r]


def closure(requirements: Iterable[str]) -> list[metadata.Distribution]:
    """The distributions of this environment that `requirements` need, transitively (extras not followed)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = metadata.distribution(req.name)  # PackageNotFoundError: the dev venv lacks a declared dependency
        seen[key] = dist
        todo.extend(Requirement(r) for r in dist.requires or [])
    return list(seen.values())


def link_requirements(python: Path, requirements: Iterable[str], workdir: Path) -> list[str]:
    """Link the closure of `requirements` (from this environment) onto the fresh interpreter's path; the names."""
    folder = workdir / "linked-deps"
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for dist in closure(requirements):
        names.append(dist.metadata["Name"])
        root = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            link = folder / top
            if not link.exists() and (root / top).exists():
                link.symlink_to(root / top)
    add_paths(python, folder)
    return sorted(names)

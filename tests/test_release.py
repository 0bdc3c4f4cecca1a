"""podguard as a release: one version, a README that works on PyPI, a changelog, the release check, and the
wheel (built from the sdist, as PyPI users get it) installed by pip into a fresh venv and run from there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from freshvenv import link_requirements, make_venv

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPOSITORY = PYPROJECT["project"]["urls"]["Repository"]
RELEASE_CHECK = ROOT / ".github" / "scripts" / "release_check.py"


def _version() -> str:
    from podguard import __version__

    return __version__


def test_the_version_lives_in_one_place() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "podguard.__version__"}
    proc = subprocess.run([sys.executable, "-m", "podguard", "--version"], capture_output=True, text=True)
    assert proc.stdout == f"podguard {_version()}\n", proc.stderr
    # the image gets it as a build argument: no Dockerfile names a version of its own
    for dockerfile in (ROOT / "Dockerfile", ROOT / "docker" / "torch-base.Dockerfile"):
        args = re.findall(r"^ARG PODGUARD_VERSION(=.*)?$", dockerfile.read_text(), re.MULTILINE)
        assert args == ["=unknown"], (dockerfile, args)
        assert _version() not in dockerfile.read_text()


def _links(markdown: str) -> list[str]:
    inline = re.findall(r"\[[^\]]+\]\(([^)\s]+)\)", markdown)
    references = re.findall(r"^\[[^\]]+\]:\s*(\S+)", markdown, re.MULTILINE)
    return inline + references


def test_readme_links_work_on_pypi() -> None:
    """PyPI renders the README without the repository around it: a relative link (`docs/gate.md`) is dead
    there. Every link is absolute; those into the repository name a file that exists in this checkout."""
    readme = (ROOT / "README.md").read_text()
    links = _links(readme)
    assert len(links) > 20
    relative = [link for link in links if not re.match(r"https?://", link)]
    assert relative == [], relative
    for link in links:
        if link.startswith(REPOSITORY + "/"):
            match = re.fullmatch(re.escape(REPOSITORY) + r"/(?:blob|tree)/main/([^#]+)(#.*)?", link)
            assert match, f"{link}: not a /blob/main/ or /tree/main/ link"
            assert (ROOT / match.group(1)).exists(), f"{link}: {match.group(1)} is not in the checkout"
    for url in PYPROJECT["project"]["urls"].values():
        assert url.startswith(REPOSITORY), url


def test_readme_says_what_works_today_and_keeps_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    two = (
        "```bash\n"
        "make run     # the built-in demo training job: DDP on the selected GPUs, or 2 CPU processes (gloo) "
        "without a GPU\n"
        "make test    # the whole test suite\n"
        "```\n"
    )
    assert "## The two commands\n\n" + two in readme  # exactly as they were
    assert "not on PyPI yet" in readme
    assert f"pip install 'podguard @ git+{REPOSITORY}'" in readme and "make dist" in readme


def test_the_changelog_names_the_current_version_and_keeps_an_unreleased_section() -> None:
    sys.path.insert(0, str(RELEASE_CHECK.parent))
    try:
        import release_check
    finally:
        sys.path.remove(str(RELEASE_CHECK.parent))
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]$", text, re.MULTILINE)
    assert release_check.changelog_section(_version(), text), f"CHANGELOG.md has no dated section for {_version()}"
    assert release_check.package_version() == _version()


def _fake_dist(folder: Path, version: str, *, meta_version: str | None = None) -> Path:
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / f"podguard-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"podguard-{version}.dist-info/METADATA", f"Name: podguard\nVersion: {meta_version or version}\n")
    (folder / f"podguard-{version}.tar.gz").write_bytes(b"")
    return folder


def test_release_check_refuses_a_tag_that_does_not_name_the_version(tmp_path: Path) -> None:
    version = _version()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    check = [sys.executable, str(RELEASE_CHECK)]
    wrong = subprocess.run(
        [*check, "--tag", "v99.0.0", str(_fake_dist(tmp_path / "a", version))], env=env, capture_output=True, text=True
    )
    assert wrong.returncode == 1
    assert f"the tag 'v99.0.0' does not name the package version: expected 'v{version}'" in wrong.stderr
    stale_dist = _fake_dist(tmp_path / "b", version, meta_version="0.0.1")
    stale = subprocess.run([*check, str(stale_dist)], env=env, capture_output=True, text=True)
    assert stale.returncode == 1 and "metadata says version '0.0.1'" in stale.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = subprocess.run([*check, str(empty)], env=env, capture_output=True, text=True)
    assert missing.returncode == 1 and "(run `make dist`)" in missing.stderr


def test_a_dry_run_reports_the_changelog_and_still_checks_the_files(tmp_path: Path) -> None:
    """The workflow run by hand on main (entries under Unreleased: the normal state between releases)."""
    version = _version()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    check = [sys.executable, str(RELEASE_CHECK), "--dry-run"]
    good = subprocess.run([*check, str(_fake_dist(tmp_path / "a", version))], env=env, capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = subprocess.run([*check, str(empty)], env=env, capture_output=True, text=True)
    assert missing.returncode == 1 and "(run `make dist`)" in missing.stderr


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    """`python -m build` (the sdist, then the wheel built from it), `twine check --strict`, pip installs the
    wheel into a fresh venv; its declared core dependencies are linked from the dev venv (no index; a missing
    declaration fails here), and the installed `podguard` script runs as a newcomer would run it."""
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    version = _version()
    wheel, sdist = dist / f"podguard-{version}-py3-none-any.whl", dist / f"podguard-{version}.tar.gz"
    assert sorted(dist.iterdir()) == sorted([wheel, sdist])
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], capture_output=True, text=True
    )
    assert twine.returncode == 0, twine.stdout + twine.stderr

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"podguard-{version}.dist-info/METADATA").decode()
    package = ROOT / "entrypoint" / "podguard"
    sources = {f"podguard/{p.relative_to(package)}" for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    assert sources <= names, f"not in the wheel: {sorted(sources - names)}"  # a folder without __init__.py?
    assert "License-Expression: Apache-2.0" in metadata and "Description-Content-Type: text/markdown" in metadata
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
    core = [r for r in requires if "extra ==" not in r]
    assert sorted(r.split("<")[0].split(">")[0] for r in core) == ["nvidia-ml-py", "prometheus_client", "typer"], core

    python = make_venv(tmp_path / "venv")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    link_requirements(python, core, tmp_path)
    podguard = python.parent / "podguard"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"LD_LIBRARY_PATH": "", "PODGUARD_STATE_DIR": str(tmp_path / "state"), "CUDA_VISIBLE_DEVICES": ""}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(podguard), *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    where = subprocess.run(
        [str(python), "-c", "import podguard; print(podguard.__file__)"], env=env, capture_output=True, text=True
    )
    assert where.stdout.startswith(str(tmp_path / "venv")), where.stdout + where.stderr  # the wheel's copy
    assert run("--version").stdout == f"podguard {version}\n"
    helped = run("--help")
    assert helped.returncode == 0 and all(c in helped.stdout for c in ("train", "doctor", "health", "pod", "image"))
    doctor = run("doctor", "--json")
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["podguard_version"] == version
    demo = run("train")  # what a newcomer types first, with no torch: one line, 64
    assert demo.returncode == 64 and len(demo.stderr.splitlines()) == 1, demo.stderr
    assert "needs torch" in demo.stderr and "pip install 'podguard[torch]'" in demo.stderr

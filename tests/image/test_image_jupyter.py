"""Jupyter the RunPod way: JUPYTER_PASSWORD starts it (token = the password) when it is installed; when it
is not, the container says so in one line and runs its command anyway.

The image does not ship Jupyter (core + torch only), so the real start is tested on an image built FROM
the session's image with jupyterlab installed from wheels downloaded on the host (cached by Docker).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from imagetools import ROOT, docker, wait_for, wait_for_log

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PASSWORD = "correct-horse-battery"
DOCKERFILE = """FROM {base}
COPY wheels/ /tmp/wheels/
RUN pip install --no-index --find-links /tmp/wheels jupyterlab && rm -rf /tmp/wheels
"""


def _jupyterlab_wheels() -> Path:
    """jupyterlab + its dependencies as wheels for the image's Python, downloaded once into build/."""
    cache = ROOT / "build" / "image-tests" / "jupyterlab-wheels"
    if any(cache.glob("jupyterlab-*.whl")):
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".jupyterlab-", dir=cache.parent))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11"]
    cmd += ["--implementation", "cp", "-d", str(partial), "jupyterlab"]
    for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014", "linux"):
        cmd += ["--platform", f"{tag}_x86_64"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        message = f"cannot download jupyterlab's wheels: {proc.stderr.strip()[-500:]}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        partial.rename(cache)  # whole or not at all: a concurrent session may have won the race
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return cache


@pytest.fixture(scope="module")
def jupyter_image(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    context = tmp_path_factory.mktemp("jupyter-image")
    shutil.copytree(_jupyterlab_wheels(), context / "wheels")
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=image))
    tag = image.replace(":", "-jupyter:", 1)
    docker("build", "-q", "-t", tag, str(context), timeout=600, check=True)
    yield tag
    docker("rmi", "-f", tag, timeout=120)  # ~230 MB of its own, rebuilt whenever the session's image changes


def _status(port: int, token: str | None) -> int:
    url = f"http://127.0.0.1:{port}/api/status" + (f"?token={token}" if token is not None else "")
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # not listening yet


def test_jupyter_starts_with_the_password_as_token(jupyter_image: str) -> None:
    run = docker(
        "run", "-d", "-e", f"JUPYTER_PASSWORD={PASSWORD}", "-p", "127.0.0.1::8888",
        jupyter_image, "bash", "-c", "echo JOB UP; exec sleep 600",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    cid = run.stdout.strip()
    try:
        wait_for_log(cid, "JOB UP")
        port = int(docker("port", cid, "8888/tcp", check=True).stdout.split(":")[-1])
        assert wait_for(lambda: _status(port, PASSWORD) == 200, "Jupyter to answer with the token", 90, cid)
        assert _status(port, None) == 403
        assert _status(port, "wrong-token") == 403
        # The password is in Jupyter's environment, never on a command line (ps, podguard's reports).
        cmdlines = docker("exec", cid, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '", check=True).stdout
        assert "jupyter" in cmdlines
        assert PASSWORD not in cmdlines
    finally:
        docker("rm", "-f", cid)


def test_jupyter_password_without_jupyter_says_so(container) -> None:
    cid = container("bash", "-c", "echo JOB UP; exec sleep 600", opts=["-e", f"JUPYTER_PASSWORD={PASSWORD}"])
    out = wait_for_log(cid, "JOB UP")
    line = "JUPYTER_PASSWORD is set but Jupyter is not installed in this image; not started"
    assert line in out, out

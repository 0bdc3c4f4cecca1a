"""podguard on an image that already has torch: `podguard image build --torch base`, the RunPod start command
on a torch image, and the three-line `FROM your-image` Dockerfile, on the real engine.

The torch-bearing base is the tests' Debian base plus torch in a conda-style /opt/conda first on PATH
(tests/image/support/build-torch-base.sh), built once and cached. The start command and the Dockerfile are
read from docs/ways-in.md, so what users copy is what runs here. No package index is reachable: podguard's
wheelhouse stands in for it (`PIP_NO_INDEX` + `PIP_FIND_LINKS`), the way a user's image reaches PyPI.
The other image tests that apply (exit codes, SSH env, HEALTHCHECK, restarts) run on this image too
(`any_image` / `any_container` in conftest.py).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from imagetools import BASE_IMAGE, ROOT, BuiltImage, docker, logs, podguard, wait_for_log

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BUDGET_BYTES = 30_000_000
WAYS_IN = ROOT / "docs" / "ways-in.md"
# A real (small) training job on the base's torch: a linear fit that must converge.
TRAIN_PY = """\
import torch
torch.manual_seed(0)
x = torch.randn(256, 4)
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(300):
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"TRAINED loss={loss.item():.5f} torch={torch.__version__}", flush=True)
assert loss.item() < 1e-3
"""


def _ours(image: str, base: str) -> list[tuple[int, str]]:
    """(bytes, created by) of each layer `image` has over `base`, from `docker history` (newest first)."""
    fmt = ["--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}"]
    mine = docker("history", *fmt, image, check=True).stdout.splitlines()
    theirs = docker("history", *fmt, base, check=True).stdout.splitlines()
    assert mine[len(mine) - len(theirs) :] == theirs, "the image does not sit on its base's layers"
    return [(int(size), created) for size, created in (line.split("\t", 1) for line in mine[: len(mine) - len(theirs)])]


def _code_block(language: str) -> str:
    """The first fenced block of `language` in docs/ways-in.md."""
    match = re.search(rf"^```{language}\n(.*?)^```", WAYS_IN.read_text(), re.MULTILINE | re.DOTALL)
    assert match, f"no ```{language} block in {WAYS_IN}"
    return match.group(1)


@pytest.fixture(scope="module")
def local_index(built_torch_base: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """podguard's wheel and its core dependencies (what `pip install podguard` fetches from PyPI), copied
    from the wheelhouse the `--torch base` build made (for the base's Python)."""
    index = tmp_path_factory.mktemp("index")
    for folder in ("app", "deps-base"):
        for wheel in (ROOT / "docker" / "wheelhouse" / folder).glob("*.whl"):
            if not wheel.name.startswith("pip-"):
                shutil.copy(wheel, index)
    assert any(index.glob("podguard-*.whl")) and any(index.glob("typer-*.whl")), sorted(index.iterdir())
    return index


@pytest.fixture
def train_py(tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN_PY)
    folder.chmod(0o755)
    return folder


def test_torch_base_build_adds_at_most_30_mb_and_says_so(built_torch_base: BuiltImage, torch_base: str) -> None:
    result = built_torch_base.result
    assert result is not None
    layers = _ours(built_torch_base.tag, torch_base)
    added = sum(size for size, _ in layers)
    print(f"\n[image] --torch base: {added / 1e6:.1f} MB over {torch_base}:")
    for size, created in layers:
        print(f"  {size / 1e6:8.2f} MB  {created[:100]}")
    assert added <= BUDGET_BYTES, layers
    assert added > 1_000_000, "podguard's layers are missing"  # podguard + typer + rich are a few MB
    assert result["added_bytes"] == added, (result["added_bytes"], added)
    line = re.search(r"podguard adds ([\d.]+) MB over (\S+) \(budget 30 MB\)", built_torch_base.progress)
    assert line and line.group(2) == torch_base, built_torch_base.progress[-2000:]
    assert abs(float(line.group(1)) * 1e6 - added) < 100_000, line.group(0)
    assert "its torch 2.13.0" in built_torch_base.progress


def test_one_torch_the_bases_and_the_base_environment_untouched(torch_base_image: str) -> None:
    script = (
        "find / -xdev -type d -name torch -path '*-packages/torch' 2>/dev/null; "
        "echo PODGUARD_SEES=$(/opt/podguard/bin/python -c 'import torch; print(torch.__file__)' 2>/dev/null); "
        "echo PYTHON=$(command -v python3); "
        "python3 -c 'import podguard' 2>/dev/null && echo BASE_SEES_PODGUARD; "
        "ls -d /opt/podguard/lib/python3.11/site-packages/pip* 2>/dev/null && echo PODGUARD_HAS_PIP; "
        "find /opt/podguard /tmp /usr/local -name '*.whl' 2>/dev/null"
    )
    proc = docker("run", "--rm", "--entrypoint", "sh", torch_base_image, "-c", script, check=True)
    lines = proc.stdout.splitlines()
    torches = [line for line in lines if line.endswith("/torch")]
    assert torches == ["/opt/conda/lib/python3.11/site-packages/torch"], lines
    assert "PODGUARD_SEES=/opt/conda/lib/python3.11/site-packages/torch/__init__.py" in lines, lines
    assert "PYTHON=/opt/conda/bin/python3" in lines, lines  # the base's PATH is kept
    assert "BASE_SEES_PODGUARD" not in lines, "podguard's packages leaked into the base's environment"
    assert "PODGUARD_HAS_PIP" not in lines and not [x for x in lines if x.endswith(".whl")], lines


def test_the_demo_trains_on_the_bases_torch(torch_base_image: str) -> None:
    proc = docker("run", "--rm", torch_base_image, "train", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"^podguard train: PASS", out, re.MULTILINE), out[-3000:]
    assert re.search(r"\[demo\] DONE steps=\d+ .*ranks=2 device=cpu backend=gloo", out), out[-3000:]


def test_a_base_without_torch_is_refused_before_anything_is_built(torch_base: str) -> None:
    tag = f"podguard-test-notorch-{uuid.uuid4().hex[:8]}:latest"
    proc = podguard("image", "build", "--base", BASE_IMAGE, "--torch", "base", "--tag", tag, timeout=120)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 64, lines
    assert len(lines) == 1 and "has no torch" in lines[0] and BASE_IMAGE in lines[0], lines
    assert docker("image", "inspect", tag).returncode != 0, "an image was built"


def test_runpod_start_command_on_a_torch_image(torch_base: str, local_index: Path) -> None:
    command = _code_block("sh").strip()
    assert command == "bash -c 'pip install podguard && exec podguard train -- python train.py'", command
    script = command.removeprefix("bash -c '").removesuffix("'").replace(" -- python train.py", "")  # the demo
    opts = ["-v", f"{local_index}:/index:ro", "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/index"]
    proc = docker("run", "--rm", *opts, torch_base, "bash", "-c", script, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Successfully installed" in out and "torch" not in out.split("Successfully installed")[1].split("\n")[0]
    assert re.search(r"^podguard train: PASS", out, re.MULTILINE), out[-3000:]
    assert re.search(r"\[demo\] DONE steps=\d+ .*ranks=2", out), out[-3000:]


@pytest.fixture(scope="module")
def three_line_image(torch_base: str, local_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """docs/ways-in.md's Dockerfile built FROM the torch base, which reaches a local index instead of PyPI."""
    lines = _code_block("dockerfile").strip().splitlines()
    assert len(lines) == 3 and lines[0] == "FROM your-image", lines
    context = tmp_path_factory.mktemp("three-lines") / "context"
    shutil.copytree(local_index, context / "index")
    reach_index = ["COPY index/ /opt/index/", "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/opt/index"]
    (context / "Dockerfile").write_text("\n".join([f"FROM {torch_base}", *reach_index, *lines[1:]]) + "\n")
    tag = f"podguard-test-3line-{uuid.uuid4().hex[:8]}:latest"
    docker("build", "-q", "-t", tag, str(context), timeout=400, check=True)
    yield tag
    docker("rmi", "--no-prune", tag, timeout=120)


def test_three_line_dockerfile_runs_the_job(three_line_image: str, train_py: Path) -> None:
    opts = ["-v", f"{train_py}:/job:ro", "-w", "/job"]
    proc = docker("run", "--rm", *opts, three_line_image, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"^podguard train: PASS", out, re.MULTILINE), out[-3000:]
    assert re.search(r"^TRAINED loss=0\.\d+ torch=2\.13\.0", out, re.MULTILINE), out[-3000:]
    assert "job finished successfully" in out, out[-3000:]
    config = json.loads(docker("image", "inspect", three_line_image, check=True).stdout)[0]["Config"]
    assert config["Cmd"] == ["podguard", "train", "--", "python", "train.py"], config["Cmd"]


def test_three_line_image_stops_cleanly_with_podguard_as_pid1(three_line_image: str) -> None:
    # No tini in this image: podguard is PID 1, forwards docker stop's SIGTERM to the job and exits 143.
    job = "print('JOB UP', flush=True); import time; time.sleep(600)"
    proc = docker("run", "-d", three_line_image, "podguard", "train", "--", "python", "-c", job, timeout=60)
    assert proc.returncode == 0, proc.stderr
    cid = proc.stdout.strip()
    try:
        wait_for_log(cid, "JOB UP")
        pid1 = docker("exec", cid, "cat", "/proc/1/cmdline", check=True).stdout.replace("\0", " ")
        assert "podguard train" in pid1, pid1
        start = time.monotonic()
        docker("stop", "-t", "10", cid, timeout=60, check=True)
        took = time.monotonic() - start
        assert took < 6, f"docker stop took {took:.1f} s: SIGTERM did not end the job (SIGKILL after 10 s)"
        assert docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip() == "143", logs(cid)[-2000:]
    finally:
        docker("rm", "-f", cid, timeout=60)

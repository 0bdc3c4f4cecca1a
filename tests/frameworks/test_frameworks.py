"""The frameworks people bring (issue 23): Lightning, HF transformers + accelerate, from PyPI, on CPU with gloo.

Tiny models built from config objects (no hub download), random data, 2 CPU ranks; `podguard` runs as a user runs
it (a subprocess on the fake node, without its driver: CPU only). Single mode: the framework starts its own ranks.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobproc import run_podguard
from loadfactor import scaled

HERE = Path(__file__).parent
PY = sys.executable
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("torch", "lightning", "transformers", "accelerate", "rich")),
        reason="needs torch, lightning, transformers, accelerate and rich (pip install 'podguard[frameworks]')",
    ),
]
needs_pyspy = pytest.mark.skipif(
    shutil.which("py-spy") is None and not Path(PY).with_name("py-spy").exists(),
    reason="py-spy is not installed (pip install 'podguard[stacks]')",
)
ACCELERATE = str(Path(PY).with_name("accelerate"))


@pytest.fixture
def node(cli_node):
    return cli_node


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def lightning(node, *args: str, mode: str, devices: int, step_s: float) -> subprocess.CompletedProcess[str]:
    job = [PY, str(HERE / "lightning_job.py"), mode, str(devices), str(step_s)]
    return run_podguard(node, ["run", "--grace", "2", *args, "--", *job], cpu=True, timeout=120)


def test_a_healthy_lightning_job_with_its_default_bar_is_not_hung(node):
    """RichProgressBar (rich is installed) drew nothing on a pipe until the end: a job stepping at 4 it/s for 10 s
    under an 8 s hang timeout was 79. The bar now draws on podguard's pipe and each redraw is progress."""
    proc = lightning(node, "--hang-timeout", "8", mode="healthy", devices=1, step_s=0.25)
    assert proc.returncode == 0, said(proc)[-3000:]
    assert "HUNG" not in said(proc)
    redraws = [line for line in proc.stdout.splitlines() if line.startswith("Epoch 0/0")]
    assert len(redraws) >= 10, proc.stdout[-2000:]  # while it ran, not once at the end
    assert "\x1b[2K" not in proc.stdout and "\x1b[1A" not in proc.stdout  # redraws are lines: no cursor moves


@needs_pyspy
def test_a_lightning_hang_keeps_its_stuck_function_in_the_evidence(node, tmp_path):
    started = time.monotonic()
    proc = lightning(node, "--hang-timeout", "8", mode="hang", devices=2, step_s=0.05)
    assert proc.returncode == 79, said(proc)[-3000:]
    assert time.monotonic() - started < 90
    out = said(proc)
    assert "podguard: HUNG: " in out
    assert "in load_shard" in out and "rank 1 is the likely stuck rank" in out, out[-3000:]
    (hang,) = (tmp_path / "state" / "runs").glob("*/hang")
    assert any("load_shard" in f.read_text(errors="replace") for f in (hang / "stacks").glob("*.txt"))


@needs_pyspy
def test_a_ddp_hang_in_hf_transformers_under_accelerate_names_the_stuck_rank(node):
    """Rank 0 waits in DDP's gradient all-reduce inside `backward`; rank 1 is stuck in its loader: named."""
    job = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    job += ["--mixed_precision", "no", "--dynamo_backend", "no", str(HERE / "hf_accelerate_job.py")]
    # the ranks talk until DDP is set up, but `accelerate launch` imports torch silently before it starts them:
    # the hang timeout covers that start-up (8 s on an idle machine, stretched by the load factor)
    hang = f"{scaled(8):.1f}"
    proc = run_podguard(node, ["run", "--hang-timeout", hang, "--grace", "2", "--", *job], cpu=True, timeout=120)
    assert proc.returncode == 79, said(proc)[-3000:]
    out = said(proc)
    assert "rank 1: hf_accelerate_job.py" in out and "in next_batch" in out
    assert "rank 1 is the likely stuck rank" in out, out[-3000:]
    assert "Traceback" not in proc.stdout  # torchrun's SignalException after the verdict: one line, not ~25
    assert "torch elastic stopped by signal 15" in proc.stdout


def test_accelerate_launch_inside_torchrun_mode_is_refused(node):
    """It ran two launchers: torchrun's 2 ranks each ran `accelerate launch`, 4 processes doing the same work."""
    job = [ACCELERATE, "launch", "--num_processes", "2", str(HERE / "hf_accelerate_job.py")]
    proc = run_podguard(node, ["train", "--mode", "torchrun", "--cpu-workers", "2", "--", *job], cpu=True)
    assert proc.returncode == 64, said(proc)[-2000:]
    assert "launcher (accelerate launch)" in proc.stderr and "--mode single -- " in proc.stderr
    assert "Traceback" not in said(proc) and "step 0" not in said(proc)


def test_a_lightning_crash_names_the_rank_that_raised_first_not_the_last_lines(node):
    """Rank 1 raises; rank 0 then fails with gloo's `Connection closed by peer`, whose traceback is the last lines."""
    proc = lightning(node, mode="crash", devices=2, step_s=0.05)
    assert proc.returncode == 1, said(proc)[-3000:]
    out = said(proc)
    summary = out[out.index("podguard: the job (CPU only) exited with code 1") :]
    first = summary.index("first error in the output of job: [rank1]: ValueError: rank 1: bad batch at step 3")
    assert first < summary.index("last ") and "Connection closed by peer" in summary[summary.index("last ") :]

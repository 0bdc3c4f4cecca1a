"""What a newcomer reads first, as a user runs it (real `podguard` processes): `--help` says what `auto` picks,
each message is said once and without doubled words, and a reader that stops early (`| head`) ends the
command quietly with its own exit code."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

PODGUARD = [sys.executable, "-m", "podguard"]
_NOT_INHERITED = ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT", "NUM_NODES")


def cpu_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A node without a driver (these CI machines), a private state dir."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    return env | {"LD_LIBRARY_PATH": "", "PODGUARD_STATE_DIR": str(tmp_path / "state"), **extra}


def _flat(text: str) -> str:
    """Help text without Rich's box drawing and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_help_says_what_probe_auto_and_mode_auto_pick(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*PODGUARD, "train", "--help"], env=cpu_env(tmp_path, COLUMNS="100"), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    text = _flat(proc.stdout)
    assert "auto: cuda where this Python has a CUDA build of torch and an NVIDIA driver is present" in text
    assert "(or --probe-cmd is given), else off" in text
    assert "auto: torchrun when CMD is a Python script or module" in text and "2+ GPUs are selected" in text
    assert "else single (one GPU, CPU only, any other command); the demo runs per-gpu" in text
    health = subprocess.run([*PODGUARD, "health", "--help"], env=cpu_env(tmp_path), capture_output=True, text=True)
    assert "auto: cuda where this Python has a CUDA build of torch" in _flat(health.stdout)


def _said_once(out: str) -> None:
    """No line twice, no podguard line that names podguard again, no line that is another plus '; exit N'."""
    lines = [line for line in out.splitlines() if line.strip()]
    repeated = [line for line, n in Counter(lines).items() if n > 1]
    assert not repeated, out
    assert not re.search(r"\bpodguard:? podguard\b", out), out
    for line in lines:
        head = re.sub(r"; exit \d+$", "", line)
        assert head == line or head not in lines, f"{head!r} is said twice:\n{out}"


def test_sigterm_is_told_once_without_doubled_words(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    worker = tmp_path / "w.py"
    worker.write_text(f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(30)\n")
    proc = subprocess.Popen(
        [*PODGUARD, "run", "--", sys.executable, str(worker)],
        env=cpu_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert re.search(r"^podguard: received SIGTERM after [\d.]+ s and stopped 1 worker\(s\); exit 143$", out, re.M), out
    _said_once(out)


def test_a_failing_job_is_told_once(tmp_path: Path) -> None:
    code = "import sys; print('about to fail', flush=True); sys.exit(3)"
    proc = subprocess.run(
        [*PODGUARD, "run", "--", sys.executable, "-c", code],
        env=cpu_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.returncode == 3, proc.stdout
    assert proc.stdout.count("exited with code 3") == 1, proc.stdout
    assert "podguard: the job (CPU only) exited with code 3; exit 3" in proc.stdout
    _said_once(proc.stdout)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("command", [["doctor", "--json"], ["gpus", "--json"], ["doctor"], ["health", "--json"]])
def test_a_reader_that_went_away_ends_the_command_quietly(
    cli_node, tmp_path: Path, command: list[str], unbuffered: bool
) -> None:
    """`podguard doctor --json | head`: the pipe's reader is gone before podguard writes (here: closed at once).
    No 'BrokenPipeError' (Python's shutdown message, exit 120), no traceback; the command's own exit code."""
    env = {k: v for k, v in cli_node.env.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"  # (the image sets it: writes fail mid-output, not at exit)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*PODGUARD, *command], env=env, stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr and "Exception" not in proc.stderr
    if command[0] != "health":
        assert proc.stderr == ""


def test_an_unhealthy_verdict_survives_a_closed_pipe(cli_node, tmp_path: Path) -> None:
    from fakenvml.scenario import lost_gpu

    cli_node.write(lost_gpu(3))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [*PODGUARD, "health", "--json"], env=cli_node.env, stdout=write_end, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 76, proc.stderr
    assert "BrokenPipeError" not in proc.stderr


def test_the_demo_on_a_cluster_node_is_launched_by_torchrun(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`args = "train"` (a spec's default) on an Instant Cluster node: --mode auto means torchrun there, not
    '64: multi-node needs --mode=torchrun, not --mode=per-gpu' about an option the user never gave."""
    import podguard.job.conductor as conductor
    from podguard.cli.app import main
    from podguard.launch.config import LaunchMode

    cluster_node = {"NUM_NODES": "2", "NODE_RANK": "0", "PRIMARY_ADDR": "127.0.0.1", "PRIMARY_PORT": "29555"}
    for key, value in cluster_node.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    seen = []
    monkeypatch.setattr(conductor, "run_job", lambda settings, *_: seen.append(settings.launch) or 0)
    with pytest.raises(SystemExit) as exit_:
        main(["train"])
    assert exit_.value.code == 0
    assert [cfg.mode for cfg in seen] == [LaunchMode.TORCHRUN] and seen[0].demo

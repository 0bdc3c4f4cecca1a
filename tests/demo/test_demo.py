"""The built-in demo job end to end: 2 gloo ranks started the way podguard's per-gpu launcher starts them
(RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in each worker's env), standalone as a single
process, the NaN guard stopping both ranks, and bad options rejected with 64 before torch is imported."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopback import free_port

DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _base_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PODGUARD_STATE_DIR"] = str(state)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU workers, as podguard train starts them on a GPU-less node
    return env


def _start_ranks(state: Path, world: int, *args: str) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = _base_env(state) | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "podguard.demo", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[tuple[int, str]]:
    return [(proc.wait(timeout=timeout), proc.stdout.read()) for proc in procs]  # type: ignore[union-attr]


@pytest.mark.slow
def test_demo_two_gloo_ranks_end_to_end_and_nan_stop(tmp_path: Path) -> None:
    """Two jobs at once (4 processes) to keep CI time down: a normal run with one NaN step that the guard
    skips on both ranks, and a run whose NaN makes both ranks stop with a non-zero exit."""
    start = time.monotonic()
    ok_run = _start_ranks(tmp_path / "ok", 2, "--inject-nan-at", "100")
    stop_run = _start_ranks(tmp_path / "stop", 2, "--steps", "40", "--nan-policy", "stop", "--inject-nan-at", "5")
    (rc0, out0), (rc1, out1) = _finish(ok_run)
    ok_wall = time.monotonic() - start
    (src0, sout0), (src1, sout1) = _finish(stop_run)
    assert ok_wall < 40, f"demo took {ok_wall:.1f}s"

    # --- the normal run ---
    assert rc0 == 0, out0
    assert rc1 == 0, out1
    for rank, out in ((0, out0), (1, out1)):
        for phase in ("START", "POST-IMPORT", "POST-MODEL", "END"):
            assert f"[rank {rank}] MEM:{phase} rss=" in out
        assert f"[rank {rank}] LOCK: acquired 'import'" in out and f"[rank {rank}] LOCK: released 'import'" in out
        assert f"[rank {rank}] INIT: local_rank={rank} world_size=2 device=cpu backend=gloo" in out
        progress = re.findall(rf"\[rank {rank}\] step (\d+)/200 loss \S+ \| [\d,]+ samples/s \| ETA \d+:\d\d:\d\d", out)
        assert progress == ["50", "100", "150", "200"]  # every log_every steps, not every step
        assert f"[rank {rank}] NAN-GUARD: step 100 non-finite" in out
    # the lock serialized the imports: one rank waited for the other
    assert "LOCK: waiting for 'import'" in out0 + out1
    # the dataset was prepared by one rank only; the other found it
    data_lines = re.findall(r"DATA: (prepared|cache hit)", out0 + out1)
    assert sorted(data_lines) == ["cache hit", "prepared"]
    # rank 0 prints the summary, rank 1 does not
    summary = re.search(
        r"\[demo\] DONE steps=200 final_loss=([\d.]+) accuracy=([\d.]+)% time=([\d.]+)s .* samples/s=([\d,]+) "
        r"skipped=1 ranks=2 device=cpu backend=gloo",
        out0,
    )
    assert summary, out0
    assert float(summary.group(1)) < 1.5  # it learned something (chance is ln(8) = 2.08)
    assert "DONE" not in out1
    nan_dir = tmp_path / "ok" / "nan"
    assert sorted(p.name for p in nan_dir.iterdir()) == [
        "nonfinite-step00000100-rank0.json",
        "nonfinite-step00000100-rank1.json",
    ]
    dump = json.loads((nan_dir / "nonfinite-step00000100-rank1.json").read_text())
    assert dump["loss"] == "nan" and dump["decision"] == "skip" and 1 in dump["bad_ranks"]
    stamps = list((tmp_path / "ok" / "cache").glob("*/.podguard-prepared.json"))
    assert len(stamps) == 1

    # --- the NaN-stop run: both ranks stop at step 5, non-zero, nobody hangs ---
    assert src0 == 1, sout0
    assert src1 == 1, sout1
    for rank, out in ((0, sout0), (1, sout1)):
        assert f"[rank {rank}] NAN-GUARD: non-finite values at step 5" in out and "stopping (policy stop)" in out
        assert "DONE" not in out and "Traceback" not in out
    assert len(list((tmp_path / "stop" / "nan").glob("nonfinite-step00000005-rank*.json"))) == 2


@pytest.mark.slow
def test_demo_standalone_single_process(tmp_path: Path) -> None:
    env = _base_env(tmp_path)
    cmd = [sys.executable, "-m", "podguard.demo", "--steps", "30", "--log-every", "10"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[rank 0] INIT: local_rank=0 world_size=1 device=cpu backend=gloo" in first.stdout
    assert "process group" not in first.stdout  # no process group for one process
    assert re.search(r"\[demo\] DONE steps=30 .* ranks=1 .* dataset=prepared", first.stdout)
    assert len(re.findall(r"\[rank 0\] step \d+/30 ", first.stdout)) == 3
    # a second run finds the prepared dataset
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0
    assert "dataset=cache hit" in second.stdout


def test_demo_config_file_and_preset(tmp_path: Path) -> None:
    from podguard.demo.train import parse_args, parse_steps

    args = parse_args(["--preset", "debug", "--steps", "3", "--inject-nan-at", "2-4"])
    assert args.preset == "debug" and args.steps == 3
    assert parse_steps("2-4") == {2, 3, 4} and parse_steps("7") == {7} and parse_steps(None) == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "steps=0 is not valid"),
        (["--steps", "many"], "invalid int value"),
        (["--preset", "huge"], "invalid choice: 'huge'"),
        (["--config", "/nonexistent/demo.toml"], "not found"),
        (["--inject-nan-at", "x"], "--inject-nan-at 'x' is not valid"),
        (["--inject-nan-at", "9-3"], "must not be reversed"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_demo_bad_options_exit_64_before_importing_torch(tmp_path: Path, args: list[str], message: str) -> None:
    code = (
        "import sys; from podguard.demo.train import main; rc = main(sys.argv[1:]); "
        "sys.exit(99 if 'torch' in sys.modules else rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=_base_env(tmp_path), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert proc.stderr.startswith("podguard demo: error: ") and proc.stderr.count("\n") == 1


def test_demo_without_torch_is_one_line_naming_torch_and_exit_64(tmp_path: Path) -> None:
    """A newcomer's `pip install podguard` has no torch: `podguard train` (and the demo alone) say so in one
    line with the way to get it, exit 64 (a configuration to fix: no restart or other GPU helps; 69 would send
    self-heal and `pod up` looking for capacity), and start no worker: no traceback per rank."""
    from freshvenv import ENTRYPOINT, add_paths, core_requirements, link_requirements, make_venv

    python = make_venv(tmp_path / "venv")
    link_requirements(python, core_requirements(), tmp_path)
    add_paths(python, ENTRYPOINT)
    env = _base_env(tmp_path / "state") | {"LD_LIBRARY_PATH": ""}  # a node without a driver: the CPU fallback
    env.pop("PYTHONPATH", None)
    assert subprocess.run([str(python), "-c", "import torch"], env=env, capture_output=True).returncode == 1
    for argv, prefix in (
        (["-m", "podguard", "train"], "podguard: error: "),
        (["-m", "podguard", "train", "--mode", "torchrun"], "podguard: error: "),
        (["-m", "podguard.demo"], "podguard demo: error: "),
    ):
        proc = subprocess.run([str(python), *argv], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 64, proc.stdout + proc.stderr
        assert proc.stdout == "", proc.stdout
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(prefix + "the built-in demo job needs torch"), lines
        assert "pip install 'podguard[torch]'" in lines[0] and str(python) in lines[0]
    assert not (tmp_path / "state" / "runs").exists()  # refused before any preflight or worker

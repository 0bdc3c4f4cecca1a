"""Sweeps: the GPU arithmetic, and N independent runs with disjoint GPU_LISTs, prefixed output, the first
failure's code, and signals forwarded. Runs are fake commands (the argv builder is injectable)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.job.sweep import SweepRun, plan_sweep, podguard_train_argv, run_sweep, sweep_env


def test_plan_splits_gpus_into_disjoint_runs():
    plan = plan_sweep(8, 2, 4)
    assert [r.gpu_list for r in plan.runs] == ["0,1", "2,3", "4,5", "6,7"] and plan.unused == ()
    plan = plan_sweep(8, 4)
    assert [r.gpu_list for r in plan.runs] == ["0,1,2,3", "4,5,6,7"]
    plan = plan_sweep(7, 2)
    assert len(plan.runs) == 3 and plan.unused == ("6",)
    plan = plan_sweep(["GPU-a", "GPU-b", 5], "1", "2")
    assert [r.gpus for r in plan.runs] == [("GPU-a",), ("GPU-b",)] and plan.unused == ("5",)
    assert "run0=[GPU-a]" in plan.describe()


def test_plan_arithmetic_errors_are_clear():
    with pytest.raises(PodguardError) as info:
        plan_sweep(6, 2, 4)
    assert info.value.message == "4 runs × 2 GPUs = 8 > 6 GPUs on this node"
    assert info.value.code == ExitCode.GPUS_MISSING
    with pytest.raises(PodguardError, match="4 GPUs per run > 2 GPUs on this node"):
        plan_sweep(2, 4)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((8, 0), "GPUs per run=0"),
        ((8, "two"), "GPUs per run='two'"),
        ((8, 2, 0), "runs=0"),
        ((8, 2, "-1"), "runs='-1'"),
        ((["0", "1", "1"], 1), "GPU 1 is listed twice"),
        ((["0", " "], 1), "empty entry"),
        ((-1, 1), "total GPUs=-1"),
    ],
)
def test_plan_bad_numbers_are_usage_errors(args, needle):
    with pytest.raises(UsageError) as info:
        plan_sweep(*args)
    assert needle in info.value.message and info.value.code == 64


def test_run_env_sets_gpu_list_and_strips_conflicting_overrides():
    base = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "MASTER_PORT": "12345", "NPROC_PER_NODE": "8", "KEEP": "1"}
    env = sweep_env(SweepRun(1, ("2", "3")), 2, base, name="my_sweep")
    assert env["GPU_LIST"] == "2,3" and env["KEEP"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env and "MASTER_PORT" not in env and "NPROC_PER_NODE" not in env
    assert env["PODGUARD_SWEEP_INDEX"] == "1" and env["PODGUARD_SWEEP_SIZE"] == "2"
    assert env["PODGUARD_SWEEP_NAME"] == "my_sweep.run1"


def test_default_argv_is_podguard_train():
    build = podguard_train_argv(["python", "a.py", "--lr", "3"], ["--mode", "torchrun"])
    assert build(SweepRun(0, ("0",))) == [
        sys.executable, "-m", "podguard", "train", "--mode", "torchrun", "--", "python", "a.py", "--lr", "3"
    ]  # fmt: skip


FAKE_RUN = textwrap.dedent(
    """
    import os, sys, time
    i = int(os.environ["PODGUARD_SWEEP_INDEX"])
    print(f"gpus={os.environ['GPU_LIST']} port={os.environ.get('MASTER_PORT', '-')}", flush=True)
    sys.stdout.write("half"); sys.stdout.flush(); time.sleep(0.05); sys.stdout.write(" a line\\n")
    for n in range(200):
        sys.stdout.write(f"{n} " * 20 + "\\n")
    sys.stderr.write("to stderr\\n"); sys.stdout.flush(); sys.stderr.flush()
    time.sleep({0: 0.6, 1: 0.1, 2: 0.4}[i])
    sys.stdout.write("no newline")
    sys.exit({0: 0, 1: 3, 2: 5}[i])
    """
)


def test_runs_are_independent_output_prefixed_first_failure_wins(tmp_path):
    plan = plan_sweep(6, 2, 3)
    out = io.BytesIO()
    result = run_sweep(
        plan,
        argv_builder=lambda run: [sys.executable, "-c", FAKE_RUN],
        env={"PATH": "/usr/bin:/bin", "MASTER_PORT": "12345"},
        output=out,
        log_dir=tmp_path / "logs",
    )
    assert [r.exit_code for r in result.runs] == [0, 3, 5]  # run 1 failing did not stop the others
    assert result.exit_code == 3 and result.first_failure == 1 and result.signal is None
    lines = out.getvalue().decode().splitlines()
    for i, gl in enumerate(["0,1", "2,3", "4,5"]):
        mine = [line.removeprefix(f"run{i}:") for line in lines if line.startswith(f"run{i}:")]
        assert mine[0] == f"gpus={gl} port=-" and mine[1] == "half a line"
        assert len(mine) == 2 + 200 + 1 + 1 and mine[-1] == "no newline" and "to stderr" in mine
        assert all(m == f"{n} " * 20 for n, m in enumerate(mine[2:202]))
        log = (tmp_path / "logs" / f"run{i}.log").read_text().splitlines()
        assert log == mine
    assert all(line.startswith(("run0:", "run1:", "run2:")) for line in lines)


DRIVER = textwrap.dedent(
    """
    import json, sys
    from podguard.job.sweep import plan_sweep, run_sweep
    child = (
        "import signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('stopping', flush=True), sys.exit(143)))\\n"
        "print('ready', flush=True)\\n"
        "time.sleep(30)\\n"
    )
    result = run_sweep(plan_sweep(2, 1), argv_builder=lambda run: [sys.executable, "-c", child], grace_s=5)
    print(json.dumps({"code": result.exit_code, "signal": result.signal,
                      "runs": [r.exit_code for r in result.runs]}), flush=True)
    """
)


def test_signal_to_the_sweep_is_forwarded_to_every_run():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready = 0
    lines = []
    while ready < 2:
        line = proc.stdout.readline()
        assert line, lines
        lines.append(line)
        ready += line.strip().endswith("ready")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 4
    assert rest.count("stopping") == 2
    result = json.loads(rest.strip().splitlines()[-1])
    assert result == {"code": 143, "signal": 15, "runs": [143, 143]}

"""End to end, issue 19: hangs found and explained, GPU faults named as they happen, restarts with a fresh
preflight. `podguard train|run` as real subprocesses: gloo process groups on CPU (no driver), the fake NVML node
for GPU faults (Xids and a lost GPU written into its scenario while the job runs)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenvml import scenario as sc
from jobproc import PODGUARD, run_podguard, script
from loadfactor import load_factor, scaled

pytestmark = pytest.mark.slow


@pytest.fixture
def node(cli_node):
    return cli_node


def pg(node, args, *, env=None, timeout=120.0, cpu=True):
    return run_podguard(node, args, env=env, timeout=timeout, cpu=cpu)


def runs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state" / "runs").iterdir())


def said(proc: subprocess.CompletedProcess[str]) -> str:
    """Everything podguard and the job printed (the supervisor's lines go with the job's, on stdout)."""
    return proc.stdout + proc.stderr


def end_line(err: str) -> str:
    (line,) = [ln for ln in err.splitlines() if re.match(r"^podguard (train|run): END ", ln)]
    return line


STUCK_RANK = """
    import datetime, os, sys, threading, time
    loaded = threading.Event()
    def say_loading():  # start-up talks: two ranks importing torch on a busy machine take longer than 4 s
        while not loaded.wait(1.0):
            print("loading", flush=True)
    threading.Thread(target=say_loading, daemon=True).start()
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    loaded.set()

    def load_batch():
        time.sleep(3600)  # rank 1's data loader never returns

    print(f"rank {rank} ready", flush=True)
    if rank == 1:
        load_batch()
    dist.all_reduce(torch.ones(1))
    """

needs_pyspy = pytest.mark.skipif(
    shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists(),
    reason="py-spy is not installed (pip install 'podguard[stacks]')",
)


@needs_pyspy
@pytest.mark.parametrize("mode", ["per-gpu", "torchrun"])
def test_a_rank_stuck_while_the_others_wait_in_all_reduce_is_79_with_both_stacks_and_the_stuck_rank_named(
    node, tmp_path, mode
):
    job = script(tmp_path, "stuck.py", STUCK_RANK)
    started = time.monotonic()
    # The hang clock starts at launch: the ranks talk while they start, but torchrun imports torch and starts its
    # agent silently before it starts them, so there the timeout covers that start-up (a few seconds on an idle
    # machine, 15 s with CPU hogs beside it): stretched by the load factor.
    hang = f"{scaled(4 if mode == 'per-gpu' else 10):.1f}"
    args = ["train", "--mode", mode, "--cpu-workers", "2", "--hang-timeout", hang, "--grace", "2"]
    proc = pg(node, [*args, "--", sys.executable, job])
    assert proc.returncode == 79, proc.stderr[-3000:]
    assert time.monotonic() - started < scaled(60)
    err = proc.stdout + proc.stderr
    assert "podguard: HUNG: no progress for " in err
    assert re.search(r"rank 1 is the likely stuck rank", err), err[-3000:]
    assert re.search(r"rank 0: stuck\.py:\d+ in <module> \(in all_reduce\)", err), err[-3000:]
    assert end_line(err).startswith("podguard train: END hung exit 79 after 1 attempt(s)")
    (run,) = runs(tmp_path)
    record = json.loads((run / "hang" / "hang.json").read_text())
    stacks = {s["rank"]: s for s in record["stacks"]}
    assert set(stacks) == {0, 1} and all(Path(s["path"]).is_file() for s in stacks.values())
    assert "load_batch" in stacks[1]["innermost_user_frame"]
    assert "load_batch" in Path(stacks[1]["path"]).read_text()


def test_a_steady_job_is_never_called_hung(node, tmp_path):
    job = script(
        tmp_path, "steady.py", "import time\nfor i in range(10):\n    print('step', i, flush=True); time.sleep(0.3)\n"
    )
    proc = pg(node, ["run", "--hang-timeout", "1.5", "--", sys.executable, job])  # 3 s, a line every 0.3 s
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "HUNG" not in said(proc) and end_line(said(proc)).startswith("podguard run: END success exit 0")


def test_progress_ignores_noise_lines(node, tmp_path):
    job = script(
        tmp_path,
        "noisy.py",
        """
        import time
        print("step 1 loss 2.0", flush=True)
        while True:
            print("WARNING: a library says something", flush=True)
            time.sleep(0.2)
        """,
    )
    started = time.monotonic()
    proc = pg(
        node, ["run", "--hang-timeout", "3", "--progress", r"^step \d+", "--grace", "1", "--", sys.executable, job]
    )
    assert proc.returncode == 79, proc.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert "last progress: job: 'step 1 loss 2.0'" in said(proc)


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
    reason="torchrun is not installed",
)
def test_an_anchored_progress_pattern_matches_ranks_lines_in_torchrun_mode(node, tmp_path):
    job = script(
        tmp_path, "steps.py", "import time\nfor i in range(20):\n    print('step', i, flush=True); time.sleep(0.5)\n"
    )
    # torchrun's start-up takes ~4 s; then 10 s of steps, each line `rankN:step i`: the prefix must not hide them
    args = ["train", "--mode", "torchrun", "--cpu-workers", "2", "--hang-timeout", "7", "--progress", r"^step \d+"]
    proc = pg(node, [*args, "--grace", "1", "--", sys.executable, job])
    assert proc.returncode == 0, said(proc)[-3000:]
    assert "HUNG" not in said(proc)


def test_a_rank_that_finished_its_share_is_not_called_hung(node, tmp_path):
    job = script(
        tmp_path,
        "early.py",
        """
        import os, time
        from podguard.rank import heartbeat
        rank = int(os.environ["LOCAL_RANK"])
        for step in range(3 if rank == 1 else 25):  # rank 1 is done after 0.6 s; rank 0 goes on for 5 s
            heartbeat(step)
            time.sleep(0.2)
        """,
    )
    args = ["train", "--mode", "per-gpu", "--cpu-workers", "2", "--hang-timeout", "2", "--grace", "1"]
    proc = pg(node, [*args, "--", sys.executable, job])
    assert proc.returncode == 0, said(proc)[-3000:]
    assert "HUNG" not in said(proc)


def test_heartbeats_find_a_stuck_rank_while_another_rank_keeps_printing(node, tmp_path):
    job = script(
        tmp_path,
        "beats.py",
        """
        import os, time
        from podguard.rank import heartbeat
        rank = int(os.environ["LOCAL_RANK"])
        for step in range(1000):
            if rank == 1 and step >= 3:
                print(f"rank 1 still printing at {step}", flush=True)  # prints, but makes no progress
            else:
                heartbeat(step)
            time.sleep(0.1)
        """,
    )
    proc = pg(
        node,
        [
            "train",
            "--mode",
            "per-gpu",
            "--cpu-workers",
            "2",
            "--hang-timeout",
            "3",
            "--progress",  # (issue 30: without one, any output of rank 1's own is its progress, as for the job)
            r"^step \d+",
            "--grace",
            "1",
            "--",
            sys.executable,
            job,
        ],
    )
    assert proc.returncode == 79, proc.stderr[-2000:]
    assert "podguard: HUNG: rank(s) 1: no progress (heartbeat) for " in said(proc)
    assert "job hung (rank(s) 1)" in said(proc)


def test_a_half_speed_rank_is_named_slow(node, tmp_path):
    job = script(
        tmp_path,
        "speeds.py",
        """
        import os, time
        from podguard.rank import heartbeat
        rank = int(os.environ["LOCAL_RANK"])
        period = 0.1 if rank == 2 else 0.05
        end = time.monotonic() + 5
        step = 0
        while time.monotonic() < end:
            heartbeat(step); step += 1; time.sleep(period)
        """,
    )
    proc = pg(node, ["train", "--mode", "per-gpu", "--cpu-workers", "3", "--", sys.executable, job])
    assert proc.returncode == 0, proc.stderr[-2000:]
    slow = [ln for ln in said(proc).splitlines() if "is slow:" in ln]
    assert slow and all("rank 2" in ln for ln in slow), proc.stderr[-2000:]
    assert "stragglers: rank 2" in said(proc)
    (run,) = runs(tmp_path)
    record = json.loads((run / "watch.json").read_text())
    assert [s["rank"] for s in record["stragglers"]] == [2] and record["progressed"]


# --- GPU faults (the fake NVML node) ------------------------------------------------------------------------

SLEEPER = "import os, pathlib, time\npathlib.Path(os.environ['READY'] + os.environ['RANK']).touch()\ntime.sleep(60)\n"


def wait_for_files(*paths: Path, timeout: float = 30.0) -> None:
    """Poll (with a deadline) until every worker said it runs."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"the workers did not start: {paths}"
        time.sleep(0.05)


def test_xid_79_and_a_lost_gpu_mid_run_end_the_job_with_76_in_seconds(node, tmp_path):
    job = script(tmp_path, "sleeper.py", SLEEPER)
    scenario = node.write(sc.healthy_h100(2))
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [*PODGUARD, "train", "--mode", "per-gpu", "--grace", "1", "--", sys.executable, job],
        env={**node.env, "READY": str(ready)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_files(tmp_path / "ready0", tmp_path / "ready1")  # the job runs
        scenario.xids.append(sc.XidSpec(gpu=1, xid=79, after_ms=0))
        scenario.gpus[1].lost = True
        node.write(scenario)
        faulted = time.monotonic()
        out, err = proc.communicate(timeout=60)
        err = out + err
    finally:
        proc.kill()
    assert proc.returncode == 76, err[-3000:]
    assert time.monotonic() - faulted < 15
    assert re.search(r"GPU FAULT: GPU 1 \(GPU-[0-9a-f-]+\): Xid 79", err), err[-3000:]
    assert end_line(err).startswith("podguard train: END gpu-fault exit 76")
    (run,) = runs(tmp_path)
    record = json.loads((run / "gpu_faults.json").read_text())
    first = record["faults"][0]
    assert (first["gpu"], first["xid"], first["fatal"]) == (1, 79, True) and first["uuid"].startswith("GPU-")


def test_xid_95_then_a_workers_exit_is_76_with_the_fault_as_root_cause(node, tmp_path):
    flag = tmp_path / "fault-now"
    job = script(
        tmp_path,
        "dies.py",
        f"""
        import os, pathlib, sys, time
        pathlib.Path({str(tmp_path / "ready")!r} + os.environ["RANK"]).touch()
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.05)
        if os.environ["RANK"] == "0":
            sys.exit(1)  # the uncontained ECC error kills this rank's CUDA context
        time.sleep(60)
        """,
    )
    scenario = node.write(sc.healthy_h100(2))
    proc = subprocess.Popen(
        [*PODGUARD, "train", "--mode", "per-gpu", "--grace", "1", "--", sys.executable, job],
        env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_files(tmp_path / "ready0", tmp_path / "ready1")
        scenario.xids.append(sc.XidSpec(gpu=0, xid=95, after_ms=0))
        node.write(scenario)
        flag.write_text("now")
        out, err = proc.communicate(timeout=60)
        err = out + err
    finally:
        proc.kill()
    assert proc.returncode == 76, err[-3000:]
    assert end_line(err).startswith("podguard train: END gpu-fault exit 76"), err[-2000:]
    # the supervisor's own account of rank 0's end names the fault first, and so does the job's record
    (told,) = [ln for ln in err.splitlines() if "GPU0 (rank 0) exited with code 1" in ln and "; exit " in ln]
    assert re.search(r"GPU FAULT first: GPU 0 \(GPU-[^)]*\): Xid 95.*; then GPU0 \(rank 0\) exited with code 1", told)
    (record,) = (tmp_path / "state" / "jobs").glob("*.json")
    last = json.loads(record.read_text())["history"][-1]
    assert last["exit_code"] == 76 and last["root_cause"] == "GPU 0 Xid 95", last


def test_a_restart_after_a_gpu_fault_does_not_use_that_gpu_again(node, tmp_path):
    flag = tmp_path / "fault-now"
    job = script(
        tmp_path,
        "faults_once.py",
        f"""
        import os, pathlib, sys, time
        count, rank = os.environ["PODGUARD_RESTART_COUNT"], os.environ["RANK"]
        print(f"attempt {{count}} rank {{rank}} on CUDA_VISIBLE_DEVICES={{os.environ.get('CUDA_VISIBLE_DEVICES')}}",
              flush=True)
        if count != "0":
            sys.exit(0)
        pathlib.Path({str(tmp_path / "ready")!r} + rank).touch()
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.05)
        sys.exit(1 if rank == "0" else 0)
        """,
    )
    scenario = node.write(sc.healthy_h100(2))
    proc = subprocess.Popen(
        [*PODGUARD, "train", "--mode", "per-gpu", "--restarts", "1", "--grace", "1", "--", sys.executable, job],
        env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_files(tmp_path / "ready0", tmp_path / "ready1")
        scenario.xids.append(sc.XidSpec(gpu=0, xid=95, after_ms=0))
        node.write(scenario)
        flag.write_text("now")
        out, err = proc.communicate(timeout=90)
        err = out + err
    finally:
        proc.kill()
    assert "RESTART 1 of 1" in err and "after gpu fault (GPU 0 Xid 95)" in err, err[-3000:]
    assert "fatal fault during an earlier attempt of this job: GPU 0" in err, err[-3000:]
    assert not re.search(r"attempt 1 rank \d+ on CUDA_VISIBLE_DEVICES=0\b", out), out  # never GPU 0 again


def test_xid_31_is_printed_and_nothing_ends(node, tmp_path):
    job = script(tmp_path, "short.py", "import time\nprint('working', flush=True)\ntime.sleep(4)\n")
    scenario = sc.healthy_h100(2)
    scenario.xids.append(sc.XidSpec(gpu=0, xid=31, after_ms=1500))
    node.write(scenario)
    proc = pg(node, ["train", "--mode", "per-gpu", "--", sys.executable, job], cpu=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"GPU event \(application-level, not acted on\): GPU 0 \(GPU-[0-9a-f-]+\): Xid 31", said(proc))


# --- restarts ---------------------------------------------------------------------------------------------------


def test_restarts_after_a_crash_with_a_fresh_preflight_and_the_restart_count(node, tmp_path):
    job = script(
        tmp_path,
        "flaky.py",
        """
        import os, sys
        count = int(os.environ["PODGUARD_RESTART_COUNT"])
        print("attempt", count, flush=True)
        sys.exit(0 if count == 2 else 3 + count)
        """,
    )
    proc = pg(node, ["run", "--restarts", "3", "--", sys.executable, job])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert [ln for ln in out.splitlines() if ln.startswith("attempt")] == ["attempt 0", "attempt 1", "attempt 2"]
    err = proc.stdout + proc.stderr
    assert "podguard run: RESTART 1 of 3 in 1 s after crash, exit 3" in err
    assert "podguard run: RESTART 2 of 3 in 2 s after crash, exit 4" in err
    assert err.count("podguard run: PASS") == 3  # a preflight before every attempt
    assert end_line(err) == "podguard run: END success exit 0 after 3 attempt(s)"


def test_restarts_after_a_hang(node, tmp_path):
    job = script(
        tmp_path,
        "hangs_once.py",
        """
        import os, time
        print("start", flush=True)
        if os.environ["PODGUARD_RESTART_COUNT"] == "0":
            time.sleep(60)
        """,
    )
    proc = pg(node, ["run", "--restarts", "1", "--hang-timeout", "2", "--grace", "1", "--", sys.executable, job])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESTART 1 of 1 in 1 s after hang (no progress), exit 79" in said(proc)
    assert end_line(said(proc)) == "podguard run: END success exit 0 after 2 attempt(s)"


def test_the_crash_loop_stop(node, tmp_path):
    job = script(tmp_path, "always.py", "import sys\nsys.exit(5)\n")
    proc = pg(node, ["run", "--restarts", "10", "--", sys.executable, job])
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "not restarting: crash loop: 3 attempts in a row failed the same way (crash) before any progress" in (
        said(proc)
    )
    assert end_line(said(proc)) == "podguard run: END failed exit 5 after 3 attempt(s)"


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--hang-timeout", "soon"], {}, "--hang-timeout='soon' is not a duration"),
        (["--progress", "("], {}, "--progress='(' is not a valid regular expression"),
        (["--restarts", "-1"], {}, "--restarts"),
        ([], {"PODGUARD_RESTARTS": "many"}, "--restarts"),
        (
            ["--restarts", "2"],
            {"NUM_NODES": "2", "NODE_RANK": "0", "PRIMARY_ADDR": "127.0.0.1", "PRIMARY_PORT": "29555"},
            "use --max-restarts",
        ),
    ],
)
def test_bad_values_are_64_before_anything_runs(node, tmp_path, args, env, needle):
    marker = tmp_path / "ran"
    proc = pg(node, ["train", *args, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], env=env)
    assert proc.returncode == 64, proc.stderr
    assert needle in said(proc) and "Traceback" not in said(proc)
    assert not marker.exists() and not (tmp_path / "state" / "runs").exists()


def test_a_restart_keeps_the_gpu_leases_and_gates_the_gpus_again(node, tmp_path):
    """On (fake) GPUs: the relaunched attempt's job finds its GPUs' lease files still held by podguard (no other
    run could take them in between), and a fresh preflight ran before it."""
    node.write(sc.healthy_h100(2))
    job = script(
        tmp_path,
        "leased.py",
        f"""
        import fcntl, glob, os, sys
        rank, count = os.environ["RANK"], os.environ["PODGUARD_RESTART_COUNT"]
        locks = sorted(glob.glob({str(tmp_path / "state" / "leases" / "gpus" / "GPU-*.lock")!r}))
        held = 0
        for path in locks:
            with open(path, "a") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    held += 1
        print(f"attempt {{count}} rank {{rank}}: {{held}} of {{len(locks)}} GPU leases held", flush=True)
        sys.exit(3 if count == "0" else 0)
        """,
    )
    proc = pg(node, ["train", "--mode", "per-gpu", "--restarts", "1", "--", sys.executable, job], cpu=False)
    assert proc.returncode == 0, said(proc)[-3000:]
    assert "attempt 1 rank 0: 2 of 2 GPU leases held" in proc.stdout, proc.stdout
    assert said(proc).count("podguard train: PASS on 2 GPU(s)") == 2
    assert end_line(said(proc)) == "podguard train: END success exit 0 after 2 attempt(s)"


# --- issue 23: ranks a job starts itself, the board, a full state dir ------------------------------------------

SPAWNED = """
    import datetime, os, threading, time
    loaded = threading.Event()
    def say_loading():  # start-up talks: two ranks importing torch on a busy machine take longer than 6 s
        while not loaded.wait(1.0):
            print("loading", flush=True)
    threading.Thread(target=say_loading, daemon=True).start()
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def load_batch():
        time.sleep(3600)  # rank 1's data loader never returns

    def train(rank, world):
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
        print(f"rank {rank} ready", flush=True)
        loaded.set()
        if rank == 1:
            load_batch()
        dist.all_reduce(torch.ones(1))

    if __name__ == "__main__":
        loaded.set()  # (the parent only waits: its ranks talk)
        mp.spawn(train, args=(2,), nprocs=2)
    """


@needs_pyspy
def test_an_mp_spawn_job_keeps_both_ranks_stacks_and_names_the_stuck_one(node, tmp_path):
    job = script(tmp_path, "spawned.py", SPAWNED)
    proc = pg(
        node, ["run", "--hang-timeout", "6", "--grace", "1", "--", sys.executable, job], env={"OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 79, said(proc)[-3000:]
    out = said(proc)
    assert re.search(r"podguard: rank 0: spawned\.py:\d+ in train \(in all_reduce\)", out), out[-3000:]
    assert re.search(r"podguard: rank 1: spawned\.py:\d+ in load_batch", out)
    assert "rank 1 is the likely stuck rank" in out  # was: only the parent, in ProcessContext.join
    (run,) = runs(tmp_path)
    kept = {p.name for p in (run / "hang" / "stacks").iterdir()}
    assert {"rank0.txt", "rank1.txt"} <= kept
    record = json.loads((run / "hang" / "hang.json").read_text())
    assert {s["role"] for s in record["stacks"]} >= {"rank", "helper"}  # mp's resource_tracker: kept, not compared


BEATER = """
    import os, time
    from podguard.rank import heartbeat
    rank = int(os.environ["LOCAL_RANK"])
    for step in range(120):
        if rank == 0 or step < 3:
            heartbeat(step)
        print(f"rank {rank} step {step}", flush=True)  # rank 1 prints on, but its heartbeats stop
        time.sleep(0.1)
    """


def test_cpu_torchrun_with_two_workers_on_no_gpu_keeps_rank_1s_heartbeats(node, tmp_path):
    # torchrun's silent start-up: the hang timeout (6 s on an idle machine) and the job's 120 steps of 0.1 s
    # (past it) stretched alike by the load factor
    factor = load_factor()
    job = script(tmp_path, "beater.py", BEATER.replace("range(120)", f"range({math.ceil(120 * factor)})"))
    hang = f"{6 * factor:.1f}"
    args = ["train", "--mode", "torchrun", "--hang-timeout", hang, "--progress", r"^step \d+", "--grace", "1"]
    # (--progress: rank 1's lines are noise; without one, any output of its own would be its progress, issue 30)
    proc = pg(node, [*args, "--", sys.executable, job], env={"NUM_TRAINERS": "2"})  # the old board had 1 slot
    assert proc.returncode == 79, said(proc)[-3000:]
    assert "podguard: HUNG: rank(s) 1: no progress (heartbeat) for " in said(proc)


def test_a_full_state_dir_degrades_to_warnings_and_the_job_runs(node, tmp_path):
    from fulltmpfs import full_tmpfs

    with full_tmpfs(tmp_path / "full") as state:
        job = script(tmp_path, "beats.py", "from podguard.rank import heartbeat\nfor s in range(3): heartbeat(s)\n")
        args = ["run", "--hang-timeout", "30", "--", sys.executable, job]
        proc = pg(node, args, env={"PODGUARD_STATE_DIR": str(state)})
    assert proc.returncode == 0, said(proc)[-3000:]  # was: OSError: No space left on device, a traceback
    assert "Traceback" not in said(proc)
    assert end_line(proc.stderr).startswith("podguard run: END success exit 0")

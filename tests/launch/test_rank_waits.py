"""A rank that waits is not hung (issue 30, items 1 and 5): real gloo ranks on CPU under `podguard train|run`.

Both ranks call `heartbeat(step)` as the docs recommend; then rank 0 works alone for longer than --hang-timeout
(it saves printing every second, or evaluates inside `busy()`) while rank 1 waits in `dist.barrier()`. Rank 1's
heartbeats stop, but its stack waits for the others while rank 0 makes progress: it waits, said once, and the job
ends 0 — per-gpu, torchrun and mp.spawn alike. Without any sign of life from rank 0 the job is hung (79), and so is
a rank whose busy announcement outlives its bound. While podguard waits for a save it asked for (--save-signal),
the hang clock stands still, up to --save-grace.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

import pytest

from jobproc import run_podguard, script
from loadfactor import load_factor
from podguard.launch.watch.stacks import find_py_spy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
    pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (pip install py-spy)"),
]

# On an idle machine; a run stretches both by the load factor (up to 4: rank 0's announced evaluation is bounded
# at 120 s), as the hang clock starts at launch and torchrun's start-up is silent.
HANG_S = 10
ALONE_S = 24  # rank 0's work alone: well past the hang timeout

RANKS = """
    import datetime, os, sys, threading, time
    loaded = threading.Event()

    def say_loading():  # start-up talks (as HF does while it loads): a busy machine's slow imports are no hang
        while not loaded.wait(1.0):
            print("loading", flush=True)

    threading.Thread(target=say_loading, daemon=True).start()
    import torch, torch.distributed as dist
    from podguard.rank import heartbeat

    def main(rank, world, how):
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
        for step in range(3):
            dist.all_reduce(torch.ones(1))
            heartbeat(step)
            print(f"rank {rank} step {step}", flush=True)
        loaded.set()
        if rank == 0:
            alone(how)
        dist.barrier()  # rank 1 waits here while rank 0 works alone
        heartbeat(3)
        print(f"rank {rank} done", flush=True)
        dist.barrier()
        dist.destroy_process_group()  # (gloo aborts a process that exits with its group alive)

    def alone(how):
        if how == "prints":  # a save that prints every second
            for i in range(ALONE_S):
                print(f"saving {i}/ALONE_S", flush=True)
                time.sleep(1)
        elif how == "busy":  # a silent evaluation, announced
            from podguard.rank import busy

            with busy("evaluating", max_s=120):
                time.sleep(ALONE_S)
        elif how == "busy-forever":  # announced with a short bound, and never ends
            from podguard.rank import busy

            with busy("evaluating", max_s=3):
                time.sleep(3600)
        else:  # silent: nothing says it is alive
            time.sleep(ALONE_S)

    if __name__ == "__main__":
        how = sys.argv[1]
        if "RANK" in os.environ:
            main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), how)
        else:  # one process that spawns its ranks itself
            import torch.multiprocessing as mp
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            mp.spawn(main, args=(2, how), nprocs=2)
    """

MODES = {
    "per-gpu": ["train", "--mode", "per-gpu", "--cpu-workers", "2"],
    "torchrun": ["train", "--mode", "torchrun", "--cpu-workers", "2"],
    "mp-spawn": ["run"],
}


def _stretch() -> float:
    return min(load_factor(), 4.0)


def _run(node, tmp_path: Path, mode: str, how: str, stretch: float = 1.0):
    job = script(tmp_path, "ranks.py", RANKS.replace("ALONE_S", str(round(ALONE_S * stretch))))
    hang = f"{HANG_S * stretch:.1f}"
    args = [*MODES[mode], "--hang-timeout", hang, "--grace", "2", "--", sys.executable, job, how]
    return run_podguard(node, args, cpu=True, timeout=240, env={"OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("mode", list(MODES))
def test_a_rank_waiting_in_a_barrier_while_rank_0_saves_and_prints_is_not_hung(tmp_path, cli_node, mode):
    proc = _run(cli_node, tmp_path, mode, "prints", _stretch())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    waits = [ln for ln in out.splitlines() if "waiting for the others, not hung" in ln]
    assert len(waits) == 1, out[-4000:]  # said once, naming both
    assert re.search(r"podguard: rank 1 waits in barrier at ranks\.py:\d+ in main; rank 0 made progress", waits[0])
    assert "HUNG" not in out


@pytest.mark.parametrize("mode", ["per-gpu", "torchrun"])
def test_a_silent_evaluation_announced_with_busy_is_not_a_hang(tmp_path, cli_node, mode):
    proc = _run(cli_node, tmp_path, mode, "busy", _stretch())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "HUNG" not in out


def test_a_silent_rank_0_with_nothing_announced_is_still_hung(tmp_path, cli_node):
    proc = _run(cli_node, tmp_path, "per-gpu", "silent", _stretch())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 79, out[-4000:]
    assert "podguard: HUNG: " in out


def test_a_busy_announcement_past_its_bound_no_longer_holds_the_clock(tmp_path, cli_node):
    started, stretch = time.monotonic(), _stretch()
    proc = _run(cli_node, tmp_path, "per-gpu", "busy-forever", stretch)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 79, out[-4000:]
    assert time.monotonic() - started < 3 + HANG_S * stretch + 60 + 60  # (start-up when busy, the bound, the end)


# ---------------------------------------------------------------------------------------------------------------
# item 5: the save podguard asked for

SILENT_SAVE = """
    import pathlib, signal, sys, time, zipfile
    ckpt = pathlib.Path(sys.argv[1])
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    step = 0
    while not asked:
        print(f"step {step}", flush=True)
        step += 1
        time.sleep(0.5)
    print("saving (silently, for a while)", flush=True)
    time.sleep(SAVE_S)
    ckpt.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(ckpt / f"step-{step}.pt", "w") as zf:  # a torch.save file is a zip
        zf.writestr("archive/data.pkl", b"x" * 100)
    print("saved", flush=True)
    time.sleep(3600)
    """


def test_the_hang_clock_stands_still_while_podguard_waits_for_the_save_it_asked_for(tmp_path, cli_node):
    ckpt = tmp_path / "ckpt"
    job = script(tmp_path, "saver.py", SILENT_SAVE.replace("SAVE_S", "20"))
    args = [
        "run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--save-grace", "60s", "--max-runtime", "6s",
        "--hang-timeout", "8", "--grace", "2", "--", sys.executable, job, str(ckpt),
    ]  # fmt: skip
    proc = run_podguard(cli_node, args, cpu=True, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out[-4000:]  # the guard's code, not 79
    assert "HUNG" not in out
    assert "saved checkpoint" in out and list(ckpt.glob("step-*.pt"))


def test_the_clock_runs_again_once_the_save_grace_is_over(tmp_path, cli_node):
    """The hold is bounded by --save-grace: a job that never saves is ended by the guard after the grace."""
    ckpt = tmp_path / "ckpt"
    job = script(tmp_path, "saver.py", SILENT_SAVE.replace("SAVE_S", "3600"))
    args = [
        "run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--save-grace", "5s", "--max-runtime", "4s",
        "--hang-timeout", "30", "--grace", "1", "--", sys.executable, job, str(ckpt),
    ]  # fmt: skip
    proc = run_podguard(cli_node, args, cpu=True, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out[-4000:]
    assert "no new whole checkpoint within the 5s save grace" in out

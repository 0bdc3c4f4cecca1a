"""The save request's rules without a job (guards/save.py); with real jobs: tests/job/test_checkpoint_handoff.py."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from jobproc import run_podguard
from loadfactor import scaled
from podguard.guards.save import SaveBeforeStop, SaveSettings, listed_keys, newest_new
from podguard.guards.targets import catches, is_launcher
from podguard.guards.watch import Trip
from podguard.job.restarts import made_progress


class NoSupervisor:
    """A supervisor that must not be used: a hung job is not asked to save."""

    def __getattr__(self, name):
        raise AssertionError(f"the supervisor was used ({name}) for a hung job")


def test_a_hung_job_gets_no_save_request(tmp_path):
    save = SaveBeforeStop(SaveSettings(int(signal.SIGUSR1), 60.0, tmp_path), hung=lambda: True)
    assert save.start(NoSupervisor(), done=lambda note: None) is False  # type: ignore[arg-type]
    assert save.note == "no save request (SIGUSR1): the job is hung and cannot save"
    assert not save.waiting


class NoWorkers:
    """A supervisor whose workers have all ended (or a launcher that has not started its ranks yet)."""

    def __init__(self) -> None:
        self.workers: dict[str, object] = {}


def test_no_training_process_to_ask_is_said(tmp_path):
    save = SaveBeforeStop(SaveSettings(int(signal.SIGUSR1), 60.0, tmp_path), hung=lambda: False)
    assert save.start(NoWorkers(), done=lambda note: None) is False  # type: ignore[arg-type]
    assert save.note == "no save request (SIGUSR1): no training process to ask"


def test_the_guard_line_says_whether_it_saved():
    trip = Trip("--max-runtime", "the job has run 2s (limit 2s)")
    assert trip.message == "billing guard --max-runtime: the job has run 2s (limit 2s)"
    saved = Trip(trip.guard, trip.detail, saved="saved checkpoint /c/step-9 (step 9) in 1s")
    assert saved.message.endswith("; saved checkpoint /c/step-9 (step 9) in 1s")


def test_a_missing_directory_has_no_checkpoints(tmp_path):
    assert listed_keys(tmp_path / "not-yet") == frozenset()
    assert newest_new(tmp_path / "not-yet", frozenset()) is None


@pytest.mark.parametrize(("saved", "progress"), [(True, True), (False, False)])
def test_a_new_checkpoint_is_progress_for_the_crash_loop_rule(saved, progress):
    assert made_progress(matched=False, beating=False, watched=True, duration_s=1.0, saved=saved) is progress


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["bash", "train.sh"], True),
        (["/usr/local/bin/accelerate", "launch", "train.py"], True),
        (["python", "-m", "accelerate.commands.launch", "train.py"], True),
        (["/venv/bin/python3.11", "-u", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"], True),
        (["python3", "/usr/local/bin/torchrun", "t.py"], True),
        (["python", "-mpodguard.rank.wrap", "t.py", "--", "python", "-u", "t.py"], True),
        (["python", "-u", "train.py"], False),
        (["python", "-X", "dev", "train.py"], False),
        (["python", "-m", "mypkg.train"], False),
        (["./train"], False),
        ([], False),
    ],
)
def test_launchers_and_shells_pass_the_save_signal_down(argv, launcher):
    assert is_launcher(argv) is launcher


# --- issue 31, item 5: torch.multiprocessing.spawn's ranks get the save signal ------------------------------------

SPAWNED_SAVES = """
import os, pathlib, signal, sys, time
import torch.multiprocessing as mp

def rank_main(rank, ckpt):
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))  # the training processes have the handler
    print(f"rank {rank} training", flush=True)
    step = 0
    while not asked:
        step += 1
        time.sleep(0.05)
    if rank == 0:
        folder = pathlib.Path(ckpt) / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / "state.dat").write_text(str(step))
        (folder / "COMPLETED").write_text("")
    print(f"rank {rank} saved at step {step}", flush=True)

if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1],), nprocs=2)  # the parent waits in ProcessContext.join, no handler
"""


@pytest.mark.slow
def test_the_ranks_of_mp_spawn_get_the_save_signal_not_only_their_parent(tmp_path, cli_node):
    """The save signal went to the spawn parent only: it died of it, nothing was saved, and the message blamed the
    job ("no handler") though both ranks had one."""
    ckpt = tmp_path / "ckpt"
    job = tmp_path / "spawned.py"
    job.write_text(SPAWNED_SAVES)
    # the ranks must have their handlers when --max-runtime comes (12 s on an idle machine: importing torch in the
    # parent and again in each spawned rank takes longer on a busy one): stretched by the load factor
    runtime = f"{scaled(12):.0f}s"
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--max-runtime", runtime, "--save-grace", "30s"]
    proc = run_podguard(cli_node, [*args, "--", sys.executable, str(job), str(ckpt)], cpu=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out[-3000:]
    assert "rank 0 saved at step" in out and "rank 1 saved at step" in out, out[-3000:]
    assert "SIGUSR1 to 2 process(es)" in out
    assert "saved checkpoint" in out and "no handler" not in out
    assert list(ckpt.glob("step-*/COMPLETED"))


def test_who_catches_a_signal_is_read_from_the_process(tmp_path):
    code = "import signal, time\nsignal.signal(signal.SIGUSR1, lambda *_: None)\nprint('up', flush=True)\ntime.sleep(9)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline() == "up\n"
            assert catches(proc.pid, signal.SIGUSR1) is True and catches(proc.pid, signal.SIGUSR2) is False
        finally:
            proc.kill()
    assert catches(2**22 + 11, signal.SIGUSR1) is None

"""heartbeat() and its board (issue 23, items 8, 9, 13): no system call per call, a board in /dev/shm sized for
every rank that can appear, and a place that cannot take it (full, read-only) is a warning, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import podguard.rank.progress as hb
from podguard.launch.watch.board import MIN_SLOTS, place_board, remove_board
from podguard.rank.progress import create_board, read_board


@pytest.fixture
def board_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    board = create_board(tmp_path / "hb", 4)
    monkeypatch.setenv(hb.ENV_FILE, str(board))
    monkeypatch.setenv("LOCAL_RANK", "1")
    hb._reset_for_tests()
    yield board
    hb._reset_for_tests()


def test_heartbeat_asks_the_kernel_for_its_pid_once_not_per_call(board_env: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = os.getpid

    def counting() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(os, "getpid", counting)
    for step in range(1000):
        hb.heartbeat(step)
    assert len(calls) <= 1  # was one getpid() per call: 1000
    assert read_board(board_env)[1].pid == real() and read_board(board_env)[1].count == 1000


def test_a_forked_child_beats_with_its_own_pid(board_env: Path):
    hb.heartbeat(1)  # the parent opened the board (and read its pid) before the fork
    pid = os.fork()
    if pid == 0:  # the child: one beat, then out without pytest's cleanup
        hb.heartbeat(2)
        os._exit(0)
    os.waitpid(pid, 0)
    beat = read_board(board_env)[1]
    assert (beat.step, beat.pid) == (2, pid)


def test_a_rank_forked_after_the_parent_beat_beats_into_its_own_slot(board_env: Path):
    """A launcher that forks its ranks (Lightning's ddp_fork, start_processes(start_method="fork")) after the
    parent beat: the child finds its own slot (it wrote the parent's, hiding the parent's stop)."""
    hb.heartbeat(1)  # the parent (LOCAL_RANK 1) opened slot 1
    pid = os.fork()
    if pid == 0:
        os.environ["LOCAL_RANK"] = "2"  # the launcher names the child's rank after the fork
        hb.heartbeat(7)
        os._exit(0)
    os.waitpid(pid, 0)
    board = read_board(board_env)
    assert (board[1].step, board[1].pid) == (1, os.getpid())  # the parent's slot is the parent's
    assert (board[2].step, board[2].pid) == (7, pid)


def test_the_board_has_a_slot_for_every_local_rank_whatever_was_asked(tmp_path: Path):
    placed = place_board("t1", slots=1, shm=tmp_path / "shm-missing", fallbacks=(tmp_path,))
    assert placed.path is not None
    code = "from podguard.rank import heartbeat\nfor s in range(3): heartbeat(s)\n"
    for rank in (0, 1, 7, MIN_SLOTS - 1):  # CPU torchrun's 2 workers on 0 GPUs, launchers' own ranks
        env = {"PATH": "/usr/bin:/bin", hb.ENV_FILE: str(placed.path), "LOCAL_RANK": str(rank)}
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert sorted(read_board(placed.path)) == [0, 1, 7, MIN_SLOTS - 1]  # none dropped (was: only slot 0)
    remove_board(placed)
    assert not placed.path.exists()


def test_the_board_is_in_dev_shm_never_in_the_state_dir(tmp_path: Path):
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    placed = place_board("t2", slots=2, fallbacks=(tmp_path / "run",))
    try:
        assert placed.path == Path("/dev/shm/podguard-hb-t2") and placed.in_memory and not placed.warnings
        assert placed.path.stat().st_size == 64 + 2 * 32 * MIN_SLOTS  # a heartbeat slot and a busy slot per rank
    finally:
        remove_board(placed)


PLACE_AND_STAY = """
import os, signal, sys, time
from pathlib import Path
from podguard.launch.watch.board import place_board
placed = place_board(sys.argv[2], slots=2, shm=Path(sys.argv[1]))
print(placed.path, flush=True)
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)  # a podguard killed by the OOM killer: no atexit, no cleanup
time.sleep(60)
"""


def test_a_killed_runs_board_is_removed_by_the_next_run_a_live_ones_never(tmp_path: Path):
    shm = tmp_path / "shm"
    shm.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", PLACE_AND_STAY, str(shm)]
    killed = subprocess.run([*argv, "killed-1", "kill"], env=env, capture_output=True, text=True)
    assert killed.returncode == -9
    live = subprocess.Popen([*argv, "live-2", "stay"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdout.readline().strip().endswith("live-2")
        starting = create_board(shm / "podguard-hb-starting-3", 2)  # a run between creating and locking it
        for name in ("podguard-hb-killed-1", "podguard-hb-live-2"):
            os.utime(shm / name, (1e9, 1e9))  # both past STALE_AFTER_S
        placed = place_board("next-4", slots=2, shm=shm)
        left = sorted(p.name for p in shm.iterdir())
        assert left == ["podguard-hb-live-2", "podguard-hb-next-4", starting.name]  # the killed run's is gone
        remove_board(placed)
    finally:
        live.kill()
        live.wait()
    remove_board(place_board("after-5", slots=2, shm=shm))  # the live run was killed meanwhile: its board goes too
    assert "podguard-hb-live-2" not in {p.name for p in shm.iterdir()}


def test_a_board_unlinked_under_the_run_still_counts_its_beats(tmp_path: Path):
    """Someone frees /dev/shm (`rm /dev/shm/*`, a common fix for NCCL's shm errors) while the job runs: the ranks
    keep beating into their mappings, and the watch still reads them through its own fd (it read the path: no
    beats, so a job that only beats looked silent, a false hang)."""
    from podguard.launch.watch.runtime import RuntimeSettings, RuntimeWatch

    watch = RuntimeWatch(RuntimeSettings(), tmp_path / "run")
    env = {**os.environ, **watch.worker_env(slots=2), "LOCAL_RANK": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    code = (
        "import os, sys\nfrom podguard.rank import heartbeat\nheartbeat(1)\n"
        "os.unlink(os.environ['PODGUARD_HEARTBEAT_FILE'])\nheartbeat(2)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert watch.board is not None and not watch.board.exists()
    watch.close()
    assert {slot: beat.step for slot, beat in watch.beats.items()} == {1: 2}


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    """A tiny tmpfs filled to the last block (root only; skipped where it cannot be mounted)."""
    from fulltmpfs import full_tmpfs

    with full_tmpfs(tmp_path / "full") as path:
        yield path


def test_a_full_dev_shm_falls_back_to_the_run_dir_with_a_warning(tmp_path: Path, full_dir: Path):
    placed = place_board("t3", slots=2, shm=full_dir, fallbacks=(tmp_path / "run",))
    assert placed.path == tmp_path / "run" / "heartbeats" and not placed.in_memory
    (warning,) = placed.warnings
    assert f"cannot create the heartbeat board in {full_dir} (No space left on device)" in warning
    assert "it is in" in warning and not (full_dir / "podguard-hb-t3").exists()


def test_no_place_at_all_is_warnings_and_no_board_never_a_traceback(full_dir: Path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(full_dir))
    placed = place_board("t4", slots=2, shm=full_dir, fallbacks=(full_dir / "run",))
    assert placed.path is None
    assert len(placed.warnings) == 4 and placed.warnings[-1].startswith("no heartbeat board")


SPAWN_BEATS = """
import datetime, os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
from podguard.rank import heartbeat

def rank_main(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    for step in range(3 + rank):
        heartbeat(step)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(2,), nprocs=2)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_ranks_that_mp_spawn_starts_beat_into_their_own_slots(tmp_path: Path):
    """mp.spawn's ranks have no LOCAL_RANK or RANK: each used slot 0 (one rank's beats hid the other's)."""
    from loopback import free_port

    board = create_board(tmp_path / "hb", 8)
    job = tmp_path / "spawn_beats.py"
    job.write_text(SPAWN_BEATS)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", hb.ENV_SLOT)}
    env.update({hb.ENV_FILE: str(board), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, str(job)], env=env, check=True, timeout=120)
    beats = read_board(board)
    assert {s: (b.count, b.rank) for s, b in beats.items()} == {0: (3, 0), 1: (4, 1)}


def test_a_read_only_dev_shm_falls_back_too(tmp_path: Path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        placed = place_board("t5", slots=2, shm=ro, fallbacks=(tmp_path / "run",))
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    assert placed.path == tmp_path / "run" / "heartbeats"
    assert "(Read-only file system)" in placed.warnings[0]

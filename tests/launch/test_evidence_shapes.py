"""A hung job's evidence in the shapes issue 30 found wrong (items 9-12), with real processes and a real py-spy:

* a one-process job with DataLoader workers: the workers are never ranks, the main process is dumped and named;
* py-spy without CAP_SYS_PTRACE while the orphan reaper scans: its exit status is never stolen (a reaped py-spy read
  as exit 0: "no Python threads" instead of "ptrace not allowed");
* a SIGSTOPped rank (state T) is dumped (py-spy --nonblocking) and named as stopped;
* a rank waiting in init_process_group's rendezvous, or in `handle.wait()` of an async all-reduce, waits: the rank
  it waits for is named the likely stuck one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobproc import run_podguard, script
from loopback import free_port
from podguard.launch.orphans import Orphans
from podguard.launch.watch.stacks import (
    StackTarget,
    capture_ranks,
    capture_stacks,
    find_py_spy,
    find_rank_processes,
    hang_summary,
)
from podguard.procfs import children_of, read_stat

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
pytestmark = [pytest.mark.slow, needs_py_spy]


def _env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "OMP_NUM_THREADS": "1", **extra}


@contextlib.contextmanager
def _started(argvs: list[list[str]], envs: list[dict[str, str]]) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [
        subprocess.Popen(a, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for a, e in zip(argvs, envs, strict=True)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _until_line(proc: subprocess.Popen[str], word: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "the process ended early"
        if line.startswith(word):
            return
    raise AssertionError(f"no {word!r} line within {timeout} s")


# --------------------------------------------------------------------------------------------------
# item 9: data-loader workers are never ranks

LOADER_JOB = """
    import threading, time
    loaded = threading.Event()
    def say_loading():  # start-up talks: a busy machine's slow import is no hang
        while not loaded.wait(1.0):
            print("loading", flush=True)
    threading.Thread(target=say_loading, daemon=True).start()
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Numbers(Dataset):
        def __len__(self):
            return 10**6
        def __getitem__(self, i):
            return torch.tensor([i])

    def train(loader):
        lock = threading.Lock()
        for step, batch in enumerate(loader):
            print(f"step {step}", flush=True)
            loaded.set()
            if step == 3:
                lock.acquire()
                lock.acquire()  # the main loop deadlocks; its two loader workers idle, their queue full

    train(DataLoader(Numbers(), batch_size=4, num_workers=2))
    """


@needs_torch
def test_a_one_process_job_with_data_loader_workers_dumps_and_names_its_main_process(tmp_path: Path) -> None:
    job = script(tmp_path, "loader_job.py", LOADER_JOB)
    with _started([[sys.executable, job]], [_env()]) as (proc,):
        _until_line(proc, "step 3")
        deadline = time.monotonic() + 30
        while len(children_of(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        stacks = capture_ranks(find_rank_processes({"job": proc.pid}), tmp_path / "stacks")
    ranks = [s for s in stacks if s.target.role == "rank"]
    assert [(s.target.pid, s.target.label) for s in ranks] == [(proc.pid, "job")]
    assert ranks[0].innermost_user_frame == "loader_job.py:24 in train"
    assert sorted(s.target.role for s in stacks if s.target.pid != proc.pid) == ["child", "child"]
    summary = hang_summary(stacks)
    assert summary[0] == "job: loader_job.py:24 in train"
    assert not any("none differs" in line or line.startswith("rank ") for line in summary), summary
    assert summary[-1] == "also kept: the stacks of 2 of 2 other process(es) (child), not compared"


def test_a_one_process_job_with_data_loader_workers_is_named_end_to_end(tmp_path: Path, cli_node) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    job = script(tmp_path, "loader_job.py", LOADER_JOB)
    proc = run_podguard(cli_node, ["run", "--hang-timeout", "6", "--grace", "2", "--", sys.executable, job], cpu=True)
    assert proc.returncode == 79, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "podguard: job: loader_job.py:24 in train" in said, said[-3000:]
    assert "none differs" not in said and "podguard: rank 0" not in said


# --------------------------------------------------------------------------------------------------
# item 10: the orphan reaper never takes py-spy's exit status

SLEEPER = "import time\ndef wait_here():\n    time.sleep(120)\nprint('up', flush=True)\nwait_here()\n"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_py_spy_without_ptrace_is_named_as_such_while_the_orphan_reaper_scans(tmp_path: Path) -> None:
    """The supervisor scans its children for orphans at every SIGCHLD (py-spy's own exit is one): a scan that
    reaped py-spy left Popen.wait() an exit 0 with no output. The loop here scans as fast as it can."""
    no_ptrace = tmp_path / "py-spy"
    no_ptrace.write_text(f'#!/bin/sh\nexec setpriv --bounding-set -sys_ptrace -- {find_py_spy()} "$@"\n')
    no_ptrace.chmod(0o755)
    reaper = Orphans("not-this-job")
    stop = threading.Event()

    def scan() -> None:
        while not stop.is_set():
            reaper.scan(set())

    with _started([[sys.executable, "-c", SLEEPER] for _ in range(4)], [_env()] * 4) as procs:
        for proc in procs:
            _until_line(proc, "up", 30)
        scanner = threading.Thread(target=scan, daemon=True)
        scanner.start()
        try:
            targets = [StackTarget(p.pid, i, i, None, f"GPU{i}") for i, p in enumerate(procs)]
            results = [r for _ in range(3) for r in capture_stacks(targets, tmp_path / "out", py_spy=[str(no_ptrace)])]
        finally:
            stop.set()
            scanner.join(5)
    assert [r.error for r in results if not (r.error or "").startswith("ptrace not allowed")] == []


# --------------------------------------------------------------------------------------------------
# item 11: a stopped rank

LOOPER = "import time\ndef step():\n    time.sleep(0.05)\nprint('up', flush=True)\nwhile True:\n    step()\n"


def test_a_sigstopped_rank_is_dumped_and_named_as_stopped(tmp_path: Path) -> None:
    with _started([[sys.executable, "-c", LOOPER], [sys.executable, "-c", LOOPER]], [_env()] * 2) as procs:
        for proc in procs:
            _until_line(proc, "up", 30)
        os.kill(procs[1].pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (read_stat(procs[1].pid) or read_stat(procs[0].pid)).state != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        targets = [StackTarget(p.pid, i, i, i, f"GPU{i}") for i, p in enumerate(procs)]
        stacks = capture_stacks(targets, tmp_path)
        assert read_stat(procs[1].pid).state == "T"  # left as it was: stopped
    assert stacks[1].stopped and stacks[1].error is None and stacks[1].threads
    # where the SIGSTOP found it: in the loop, or (a slow machine) still on the line after its "up"
    assert stacks[1].innermost_user_frame in ("<string>:3 in step", "<string>:4 in <module>", "<string>:6 in <module>")
    summary = hang_summary(stacks)
    assert summary[1].startswith("rank 1 (GPU 1): <string>:") and "(stopped: state T" in summary[1]
    assert summary[2].endswith("rank 1 is stopped (state T: a SIGSTOP, or a debugger holds it): "
                               "rank 1 is the likely stuck rank")  # fmt: skip


# --------------------------------------------------------------------------------------------------
# item 12: a rendezvous and an async work's wait() are waits

RENDEZVOUS_JOB = """
    import datetime, os, time
    import torch.distributed as dist

    def load_everything():
        time.sleep(3600)  # rank 1 never reaches the rendezvous

    print("up", flush=True)
    if os.environ["RANK"] == "1":
        load_everything()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    """
ASYNC_JOB = """
    import datetime, os, time
    import torch, torch.distributed as dist

    def load_batch():
        time.sleep(3600)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    print("up", flush=True)
    if dist.get_rank() == 1:
        load_batch()
    handle = dist.all_reduce(torch.ones(1), async_op=True)
    handle.wait()
    """


@needs_torch
@pytest.mark.parametrize(
    ("body", "wait", "line"),
    [(RENDEZVOUS_JOB, "init_process_group's rendezvous", 11), (ASYNC_JOB, "an async collective's wait()", 13)],
    ids=["rendezvous", "handle.wait"],
)
def test_a_rank_waiting_in_a_rendezvous_or_an_async_wait_waits(tmp_path: Path, body: str, wait: str, line: int):
    job = script(tmp_path, "job.py", body)
    port = str(free_port())
    envs = [_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for r in (0, 1)]
    with _started([[sys.executable, job]] * 2, envs) as procs:
        for proc in procs:
            _until_line(proc, "up")
        time.sleep(3)  # rank 0 is inside the rendezvous (or the wait) by now
        targets = [StackTarget(p.pid, r, r, None, f"GPU{r}") for r, p in enumerate(procs)]
        stacks = capture_stacks(targets, tmp_path / "stacks")
    assert stacks[0].collective == wait, stacks[0]
    summary = hang_summary(stacks)
    assert summary[0] == f"rank 0: job.py:{line} in <module> (in {wait})"
    assert summary[2].endswith("rank 1 is the likely stuck rank"), summary


def test_os_wait_and_a_python_wait_are_not_an_async_collective() -> None:
    from podguard.launch.watch.stack_model import Frame
    from podguard.launch.watch.verdict import collective_of

    user = Frame("main", "/w/job.py", 9)
    assert collective_of([user], 0, line_of=lambda f: "    pid, status = os.wait()\n") is None
    assert collective_of([user], 0, line_of=lambda f: "    handles[0].wait()\n") == "an async collective's wait()"
    event = Frame("wait", "/usr/lib/python3.11/threading.py", 622)
    assert collective_of([event, user], 1, line_of=lambda f: "    done.wait()\n") is None
    assert collective_of([user], 0, line_of=lambda f: "") is None  # the source cannot be read: no guess
    torch = "/x/site-packages/torch/distributed"
    rdzv = [Frame("_create_c10d_store", f"{torch}/rendezvous.py", 199), Frame("init_process_group", f"{torch}/c.py", 1)]
    rdzv.append(user)
    assert collective_of(rdzv, 2) == "init_process_group's rendezvous"


def test_a_data_loader_worker_found_only_by_its_stack_is_demoted_and_its_parent_named() -> None:
    """torch before the `pt_data_worker` thread name: the workers look like mp.spawn's ranks from outside; their
    stacks (torch's `_worker_loop`) say what they are, and the process running their loop is the rank."""
    from podguard.launch.watch.stack_model import Frame, RankStacks, ThreadStack
    from podguard.launch.watch.stacks import settle_roles

    loop = Frame("_worker_loop", "/v/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", 300)

    def stacks_of(pid: int, rank: int, frame: Frame) -> RankStacks:
        return RankStacks(StackTarget(pid, rank, rank, None, "job"), None, (ThreadStack(pid, None, False, (frame,)),),
                          None, None, 1.0)  # fmt: skip

    with _started([["sleep", "30"], ["sleep", "30"]], [_env()] * 2) as procs:
        settled, parents = settle_roles([stacks_of(p.pid, r, loop) for r, p in enumerate(procs)])
    assert [(s.target.role, s.target.rank) for s in settled] == [("child", None), ("child", None)]
    assert [(t.pid, t.role, t.label) for t in parents] == [(os.getpid(), "rank", "job")]
    busy = stacks_of(1, 0, Frame("f", "/w/t.py", 1))
    assert settle_roles([busy]) == ([busy], [])

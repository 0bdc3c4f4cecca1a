"""Evidence kept when a job is hung: every rank's Python stacks from outside (py-spy), the per-rank summary that
names the stuck rank, and torch's flight recorder (armed through the environment, dumped through its pipe).

Real processes throughout: two gloo ranks on CPU (one sleeps in user code, the other waits in all_reduce),
started directly and under torchrun with podguard's rank wrapper; a fake flight-recorder reader that makes
`<prefix><rank>.pipe` FIFOs and writes a dump when one is written to, as torch's monitor thread does (torch on
CPU makes no NCCL pipes; the real one was checked on an H100, docs/watch.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loopback import free_port
from podguard.launch.watch import flight, stacks
from podguard.launch.watch.flight import flight_recorder_env, trigger_flight_dump
from podguard.launch.watch.stack_model import Frame, RankStacks, ThreadStack, is_user_file
from podguard.launch.watch.stacks import (
    StackTarget,
    allow_tracing_by,
    capture_stacks,
    find_py_spy,
    find_rank_processes,
    hang_summary,
)
from podguard.procfs import children_of, read_stat

JOB = Path(__file__).with_name("hang_evidence_job.py")
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
SLEEPER = "import time\ndef wait_here():\n    time.sleep(60)\nprint('up', flush=True)\nwait_here()\n"


# --------------------------------------------------------------------------------------------------
# helpers


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(extra)
    return env


def _wait_lines(procs: list[subprocess.Popen[bytes]], word: bytes, count: int, timeout: float) -> None:
    """Until `count` lines starting with `word` came from the processes' stdout (select, bounded)."""
    seen, buffers = 0, {p.stdout.fileno(): b"" for p in procs if p.stdout}
    deadline = time.monotonic() + timeout
    while seen < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {seen} of {count} '{word.decode()}' lines: {buffers}"
        for fd in select.select(list(buffers), [], [], min(left, 0.5))[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"a process ended early: {buffers}"
            buffers[fd] += chunk
            seen = sum(b.count(b"\n" + word) + b.startswith(word) for b in buffers.values())


@contextlib.contextmanager
def _running(argvs: list[list[str]], envs: list[dict[str, str]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen(a, env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        for a, e in zip(argvs, envs, strict=True)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            tree = _descendants(p.pid)  # torchrun starts its ranks in sessions of their own: killpg misses them
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.wait()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def _not_stopped(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state not in ("T", "t")


def _stack(rank: int, user: str | None, collective: str | None = None, gpu: int | None = None) -> RankStacks:
    target = StackTarget(1000 + rank, rank, rank, gpu, f"GPU{rank}")
    return RankStacks(target, None, (), user, None, 5.0, collective)


# --------------------------------------------------------------------------------------------------
# stacks: real ranks


@pytest.mark.slow
@needs_torch
@needs_py_spy
def test_two_gloo_ranks_one_stuck_in_user_code_the_other_in_all_reduce(tmp_path: Path) -> None:
    port = str(free_port())
    envs = [
        _clean_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        for r in (0, 1)
    ]
    with _running([[sys.executable, str(JOB)]] * 2, envs) as procs:
        _wait_lines(procs, b"ready", 2, 120)
        time.sleep(0.3)  # rank 0 into all_reduce
        targets = find_rank_processes({"GPU0": procs[0].pid, "GPU1": procs[1].pid}, gpus={"GPU0": (0,), "GPU1": (1,)})
        assert [(t.rank, t.gpu, t.pid) for t in targets] == [(0, 0, procs[0].pid), (1, 1, procs[1].pid)]
        result = capture_stacks(targets, tmp_path / "stacks")
        assert all(_not_stopped(p.pid) for p in procs)
    by_rank = {s.target.rank: s for s in result}
    assert by_rank[0].error is None and by_rank[1].error is None
    assert by_rank[0].collective == "all_reduce"
    assert (
        by_rank[0].innermost_user_frame.startswith("hang_evidence_job.py:")
        and "in step" in by_rank[0].innermost_user_frame
    )
    assert by_rank[1].collective is None and by_rank[1].innermost_user_frame.endswith("in load_batch")
    assert {t.name for t in by_rank[0].threads} >= {"MainThread", "heartbeat"}  # all threads
    text = by_rank[0].path.read_text()
    assert "all_reduce" in text and "heartbeat" in text and str(JOB) in text
    summary = hang_summary(result)
    assert summary[0].startswith("rank 0 (GPU 0): hang_evidence_job.py:") and "(in all_reduce)" in summary[0]
    assert summary[1].startswith("rank 1 (GPU 1): hang_evidence_job.py:") and summary[1].endswith("in load_batch")
    assert "rank 0 waits in all_reduce at" in summary[2]
    assert summary[2].endswith("rank 1 is the likely stuck rank")


@pytest.mark.slow
@needs_torch
@needs_py_spy
def test_under_torchrun_the_ranks_are_found_below_the_agent_and_its_rank_wrapper(tmp_path: Path) -> None:
    """torchrun -> podguard's rank wrapper -> the rank: the ranks (not the agent, not the wrapper) are dumped,
    and their GPUs come from the wrapper's --gpus."""
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "--no-python", sys.executable, "-mpodguard.rank.wrap", "job",
        "--gpus=4,5", "--", sys.executable, "-u", str(JOB),
    ]  # fmt: skip
    env = _clean_env(PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    with _running([argv], [env]) as (agent,):
        _wait_lines([agent], b"rank", 2, 150)  # the wrapper prefixes `rank{N}:ready ...`
        time.sleep(0.3)
        targets = find_rank_processes({"torchrun": agent.pid})
        assert [(t.rank, t.local_rank, t.gpu, t.name) for t in targets] == [
            (0, 0, 4, "torchrun"),
            (1, 1, 5, "torchrun"),
        ]
        assert agent.pid not in {t.pid for t in targets}
        for t in targets:
            assert any("hang_evidence_job.py" in a for a in Path(f"/proc/{t.pid}/cmdline").read_text().split("\0"))
        result = capture_stacks(targets, tmp_path)
    summary = hang_summary(result)
    assert summary[0].startswith("rank 0 (GPU 4): ") and "(in all_reduce)" in summary[0]
    assert summary[1].startswith("rank 1 (GPU 5): ") and summary[1].endswith("in load_batch")
    assert summary[2].endswith("rank 1 is the likely stuck rank")


def test_a_rank_s_own_children_and_a_shell_in_front_are_not_ranks(tmp_path: Path) -> None:
    """bash -> python (RANK=3) -> python child (a data-loader worker inheriting RANK=3): the first Python is the
    rank; the child is kept as the rank's child."""
    child = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
    script = f"{child} print('up', flush=True); import time; time.sleep(60)"
    argv = ["bash", "-c", f'{sys.executable} -c "{script}"; true']
    with _running([argv], [_clean_env(RANK="3", LOCAL_RANK="1")]) as (proc,):
        _wait_lines([proc], b"up", 1, 30)
        time.sleep(0.2)
        targets = find_rank_processes({"GPU1": proc.pid}, gpus={"GPU1": (1,)})
    assert [t.role for t in targets] == ["rank", "child"]  # the child's stacks are kept, not compared
    assert (targets[0].rank, targets[0].local_rank, targets[0].gpu) == (3, 1, 1)
    assert targets[0].pid != proc.pid  # the Python process, not bash
    assert targets[1].rank is None and targets[1].pid not in (proc.pid, targets[0].pid)
    assert find_rank_processes({"gone": 2**22 + 7}) == []


LAUNCHER = """
import os, subprocess, sys, time
{children}
print("up", flush=True)
time.sleep(60)
"""
CHILD = "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={{**os.environ, {env}}})"


SHAPES = {
    # Lightning: the launching process is local rank 0 itself, its children have LOCAL_RANK 1..n-1
    "lightning": [CHILD.format(env="'LOCAL_RANK': '1'"), CHILD.format(env="'LOCAL_RANK': '2'")],
    # torch.multiprocessing.spawn: children without any rank variable, ranks in the order they started
    "mp-spawn": [CHILD.format(env=""), "time.sleep(0.05)", CHILD.format(env="")],
}


@pytest.mark.parametrize("shape", SHAPES)
def test_ranks_a_job_starts_itself_are_found_and_labelled(shape: str) -> None:
    code = LAUNCHER.format(children="\n".join(SHAPES[shape]))
    with _running([[sys.executable, "-c", code]], [_clean_env()]) as (proc,):
        _wait_lines([proc], b"up", 1, 30)
        time.sleep(0.3)
        kids = sorted(children_of(proc.pid), key=lambda pid: read_stat(pid).start_time)
        targets = find_rank_processes({"single": proc.pid})
    ranks = [(t.rank, t.pid) for t in targets if t.role == "rank"]
    if shape == "lightning":
        assert ranks == [(0, proc.pid), (1, kids[0]), (2, kids[1])]
    else:  # the parent (ProcessContext.join) is not a rank and not dumped
        assert ranks == [(0, kids[0]), (1, kids[1])] and proc.pid not in {t.pid for t in targets}


# --------------------------------------------------------------------------------------------------
# stacks: when they cannot be taken


@pytest.mark.slow
@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_no_ptrace_permission_is_one_line_with_the_fix(tmp_path: Path) -> None:
    """py-spy without CAP_SYS_PTRACE against a root process with it: refused, and the rank says why."""
    no_ptrace = ["setpriv", "--bounding-set", "-sys_ptrace", "--", find_py_spy()]
    with _running([[sys.executable, "-c", SLEEPER]], [_clean_env()]) as (proc,):
        _wait_lines([proc], b"up", 1, 30)
        (result,) = capture_stacks(find_rank_processes({"only": proc.pid}), tmp_path, py_spy=no_ptrace)
        assert _not_stopped(proc.pid)
    assert result.threads == () and result.path is None
    assert "ptrace not allowed" in result.error and "--cap-add SYS_PTRACE" in result.error
    assert "\n" not in result.error
    assert hang_summary([result]) == [
        f"only: no stacks: {result.error}",
        f"no stacks were taken: {result.error}",
    ]


@needs_py_spy
def test_a_process_that_is_not_python_or_has_exited_says_so(tmp_path: Path) -> None:
    with _running([["sleep", "30"]], [_clean_env()]) as (proc,):
        time.sleep(0.1)
        (result,) = capture_stacks([StackTarget(proc.pid, 0, 0, None, "GPU0")], tmp_path)
    assert result.error == "not a Python process (py-spy found no interpreter in it)"
    gone = subprocess.Popen(["true"])
    gone.wait()
    (result,) = capture_stacks([StackTarget(gone.pid, 1, 1, None, "GPU1")], tmp_path)
    assert result.error == "the process had already exited"


def test_without_py_spy_every_rank_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks, "find_py_spy", lambda: None)
    targets = [StackTarget(os.getpid(), r, r, r, f"GPU{r}") for r in (0, 1)]
    result = capture_stacks(targets, tmp_path)
    assert [r.error for r in result] == [
        "py-spy is not installed: pip install 'podguard[stacks]' (or: pip install py-spy)"
    ] * 2
    assert hang_summary(result)[-1] == f"no stacks were taken: {result[0].error}"
    assert capture_stacks([], tmp_path) == []


def test_a_py_spy_that_hangs_is_killed_and_never_leaves_the_worker_stopped(tmp_path: Path) -> None:
    """A stand-in py-spy that stops its target and never answers: the capture ends at its timeout, the
    worker runs again."""
    fake = tmp_path / "py-spy"
    fake.write_text('#!/bin/sh\nkill -STOP "$3"\nexec sleep 30\n')
    fake.chmod(0o755)
    with _running([[sys.executable, "-c", SLEEPER]], [_clean_env()]) as (proc,):
        _wait_lines([proc], b"up", 1, 30)
        started = time.monotonic()
        (result,) = capture_stacks(
            [StackTarget(proc.pid, 0, 0, 0, "GPU0")], tmp_path / "out", py_spy=[str(fake)], timeout_s=0.5
        )
        assert time.monotonic() - started < 3
        assert _not_stopped(proc.pid)
    assert result.error.startswith("py-spy did not answer within 0.5 s")


# --------------------------------------------------------------------------------------------------
# stacks: pure parts


def test_user_code_is_what_is_not_torch_libraries_the_stdlib_or_podguard() -> None:
    assert is_user_file("/workspace/train.py")
    assert is_user_file("/home/me/proj/src/model/data.py")
    assert not is_user_file("/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py")
    assert not is_user_file("/usr/lib/python3/dist-packages/numpy/core/x.py")
    assert not is_user_file("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py")
    assert not is_user_file("/opt/pytorch/torch/nn/modules/module.py")
    assert not is_user_file("/work/main/entrypoint/podguard/rank/wrap.py")
    assert not is_user_file("<frozen importlib._bootstrap>")
    assert Frame("step", "/w/train.py", 42, "train.py").where() == "train.py:42 in step"
    assert Frame("step", "/w/train.py", 42).where() == "train.py:42 in step"


def test_the_summary_names_the_ranks_that_differ() -> None:
    many = [_stack(r, "train.py:57 in step", "all_reduce", gpu=r) for r in (0, 2, 3, 5, 6, 7)]
    stuck = _stack(1, "data.py:12 in load_batch", gpu=1)
    lines = hang_summary([many[0], stuck, *many[1:]])
    assert lines[0] == "rank 0 (GPU 0): train.py:57 in step (in all_reduce)"
    assert lines[1] == "rank 1 (GPU 1): data.py:12 in load_batch"
    assert lines[-1] == (
        "ranks 0, 2-3, 5-7 wait in all_reduce at train.py:57 in step; rank 1 is at data.py:12 in load_batch: "
        "rank 1 is the likely stuck rank"
    )
    same = hang_summary([_stack(r, "train.py:57 in step", "all_reduce") for r in range(3)])
    assert (
        same[-1]
        == "all 3 ranks wait in all_reduce at train.py:57 in step: none differs (the stuck one may be elsewhere)"
    )
    odd = hang_summary([_stack(r, "train.py:80 in step") for r in range(3)] + [_stack(3, "train.py:99 in save")])
    assert (
        odd[-1]
        == "ranks 0-2 are at train.py:80 in step; rank 3 is at train.py:99 in save: rank 3 differs from the rest"
    )
    split = hang_summary([_stack(0, "a.py:1 in f"), _stack(1, "b.py:2 in g")])
    assert split[-1] == "the ranks are at different places: rank 0 is at a.py:1 in f; rank 1 is at b.py:2 in g"
    failed = RankStacks(StackTarget(9, 4, 0, None, "GPU4"), None, (), None, "the process had already exited", 0.0)
    mixed = hang_summary([_stack(0, "train.py:57 in step", "all_reduce"), failed])
    assert mixed == ["rank 0: train.py:57 in step (in all_reduce)", "rank 4: no stacks: the process had already exited"]


def test_the_main_thread_decides_and_the_innermost_user_frame_is_named() -> None:
    target = StackTarget(50, 0, 0, 0, "GPU0")
    torch_file = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    main = ThreadStack(50, "MainThread", False, (
        Frame("all_reduce", torch_file, 3252, "torch/distributed/distributed_c10d.py"),
        Frame("wrapper", "/v/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83),
        Frame("step", "/w/train.py", 57, "train.py"),
        Frame("<module>", "/w/train.py", 90, "train.py"),
    ))  # fmt: skip
    helper = ThreadStack(51, "loader", True, (Frame("read", "/w/data.py", 12, "data.py"),))
    assert stacks._where(target, [helper, main]) == ("train.py:57 in step", "all_reduce")
    assert stacks._where(target, [helper]) == ("data.py:12 in read", None)
    assert 'Thread 50 (idle): "MainThread"\n    all_reduce (' in stacks.render(target, [main])


def test_allow_tracing_by_never_raises() -> None:
    assert allow_tracing_by(os.getpid()) in (True, False)  # False where the kernel has no Yama


def test_the_ptrace_diagnosis_names_the_cause_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def status(cap: bool, seccomp: str) -> Callable[[str], str]:
        return lambda name: {"CapEff": "80000" if cap else "0", "Seccomp": seccomp}[name]

    monkeypatch.setattr(stacks, "_yama_scope", lambda: 1)
    monkeypatch.setattr(stacks, "_status_field", status(False, "2"))
    assert (
        "kernel.yama.ptrace_scope=1" in stacks.ptrace_diagnosis()
        and "--cap-add SYS_PTRACE" in stacks.ptrace_diagnosis()
    )
    monkeypatch.setattr(stacks, "_yama_scope", lambda: 3)
    assert "ptrace_scope=3" in stacks.ptrace_diagnosis()
    monkeypatch.setattr(stacks, "_yama_scope", lambda: None)
    monkeypatch.setattr(stacks, "_status_field", status(True, "2"))
    assert "seccomp" in stacks.ptrace_diagnosis()


# --------------------------------------------------------------------------------------------------
# flight recorder


ALL_NAMES = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE",
}  # fmt: skip


def test_flight_recorder_env_arms_everything_under_both_names(tmp_path: Path) -> None:
    env = flight_recorder_env(tmp_path / "fr", {})
    assert set(env) == ALL_NAMES
    prefix = str((tmp_path / "fr").resolve() / "nccl_trace_rank_")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    pipes = str((tmp_path / "fr").resolve() / "pipes" / "rank_")
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == env["TORCH_FR_DEBUG_INFO_PIPE_FILE"] == pipes
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert os.listdir(tmp_path / "fr") == ["pipes"] and os.listdir(tmp_path / "fr" / "pipes") == []  # probe gone
    modern = flight_recorder_env(tmp_path / "fr", {}, torch_version="2.11.0+cu130")
    assert set(modern) == ALL_NAMES - {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    assert set(flight_recorder_env(tmp_path / "fr", {}, torch_version="2.4.1")) == ALL_NAMES


@pytest.mark.parametrize(
    ("user", "untouched"),
    [
        ({"TORCH_FR_BUFFER_SIZE": "5000"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"}),
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"}),
        ({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/t_"}, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"}),
        ({"TORCH_FR_DUMP_TEMP_FILE": "/x/t_"}, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"}),
        ({"TORCH_FR_DEBUG_INFO_PIPE_FILE": ""}, {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE"}),
        ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, {"TORCH_NCCL_DUMP_ON_TIMEOUT"}),
    ],
)
def test_a_setting_the_user_gave_under_either_name_is_left_alone_under_both(
    tmp_path: Path, user: dict[str, str], untouched: set[str]
) -> None:
    env = flight_recorder_env(tmp_path, user)
    assert set(env) == ALL_NAMES - untouched


def test_a_recorder_the_user_turned_off_or_an_unusable_folder_arms_nothing_that_breaks_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert flight_recorder_env(tmp_path, {"TORCH_FR_BUFFER_SIZE": "0"}) == {}
    assert flight_recorder_env(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": " 0 "}) == {}
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert flight_recorder_env(blocker / "fr", {}) == {}

    def no_fifo(*_args: object, **_kw: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(flight.os, "mkfifo", no_fifo)  # a file system without FIFOs: torch's mkfifo would fail
    env = flight_recorder_env(tmp_path / "fr", {})
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in env and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_trigger_with_no_pipes_or_a_pipe_nobody_reads_returns_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    assert trigger_flight_dump(tmp_path / "none", timeout_s=5) == []
    assert trigger_flight_dump(tmp_path, timeout_s=5) == []
    (tmp_path / "pipes").mkdir()
    os.mkfifo(tmp_path / "pipes" / "rank_0.pipe")  # its rank is gone: no reader
    (tmp_path / "pipes" / "rank_1.pipe").write_text("")  # not a FIFO: never written to
    assert trigger_flight_dump(tmp_path, timeout_s=5) == []
    assert time.monotonic() - started < 1.0
    assert (tmp_path / "pipes" / "rank_1.pipe").read_text() == ""


FAKE_READER = textwrap.dedent(
    """
    import os, pickle, sys, time
    pipe, dump, ranks = sys.argv[1], sys.argv[2], [int(r) for r in sys.argv[3].split(",")]
    fds = {}
    for rank in ranks:
        os.mkfifo(f"{pipe}{rank}.pipe")
        fds[rank] = os.open(f"{pipe}{rank}.pipe", os.O_RDONLY | os.O_NONBLOCK)
    print("pipes", flush=True)
    while fds:
        for rank, fd in list(fds.items()):
            try:
                data = os.read(fd, 128)
            except BlockingIOError:
                continue
            if data:
                with open(f"{dump}{rank}", "wb") as f:   # written in two parts, like a big dump
                    f.write(pickle.dumps({"version": "2.10", "rank": rank})[:5]); f.flush(); time.sleep(0.1)
                    f.write(pickle.dumps({"version": "2.10", "rank": rank})[5:])
                del fds[rank]
        time.sleep(0.05)
    time.sleep(30)
    """
)


@pytest.mark.slow
def test_trigger_writes_every_live_pipe_and_returns_the_dumps(tmp_path: Path) -> None:
    env = flight_recorder_env(tmp_path / "fr", {})
    argv = [
        sys.executable,
        "-c",
        FAKE_READER,
        env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"],
        env["TORCH_FR_DUMP_TEMP_FILE"],
        "0,1",
    ]
    with _running([argv], [_clean_env()]) as (reader,):
        _wait_lines([reader], b"pipes", 1, 30)  # the FIFOs exist
        started = time.monotonic()
        files = trigger_flight_dump(tmp_path / "fr", timeout_s=10, environ=env)
        took = time.monotonic() - started
    assert [f.name for f in files] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert all(f.read_bytes().endswith(b".") for f in files)  # whole pickles
    assert took < 3
    assert sorted(p.name for p in (tmp_path / "fr" / "pipes").iterdir()) == ["rank_0.pipe", "rank_1.pipe"]
    assert all(stat.S_ISFIFO(p.lstat().st_mode) for p in (tmp_path / "fr" / "pipes").iterdir())


def test_the_user_s_own_prefixes_are_followed(tmp_path: Path) -> None:
    (tmp_path / "mine_3").write_bytes(b"dump")
    environ = {
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "mine_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "p_"),
    }
    assert trigger_flight_dump(tmp_path / "unused", timeout_s=1, environ=environ) == [tmp_path / "mine_3"]

"""torchrun mode: agent argv (single node, Instant Cluster multi-node), bad input -> 64, the rank wrapper,
and recovering the failing rank's real exit code from torch's error files or torchrun's summary.

The slow tests run real torchrun on CPU (gloo, 2 processes) with rank 1 failing with exit code 3. Until
the process manager exists they run the WorkerSpec with plain subprocess and build the JobOutcome here.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from podguard.errors import ExitCode, UsageError
from podguard.gpu.selected import SelectedGpu, Selection
from podguard.launch.ports import allocate_master_port
from podguard.launch.spec import JobOutcome, WorkerExit, WorkerSpec
from podguard.launch.torchrun.command import REPLY_FILE, build_torchrun_spec, classify_command, torchrun_accepts
from podguard.launch.torchrun.failure import explain_torchrun_failure
from podguard.rank.wrap import EXIT_FILE

CPU = Selection(gpus=(), source="none", inventory_count=0)
HAS_TORCH = importlib.util.find_spec("torch") is not None


def gpus(n: int) -> Selection:
    sel = tuple(SelectedGpu(i, f"GPU-{i:08d}-aaaa", f"GPU-{i:08d}-aaaa") for i in range(n))
    return Selection(gpus=sel, source="all", inventory_count=n)


def spec_for(tmp_path: Path, argv=("python", "train.py"), selection=CPU, env=None, **kw) -> WorkerSpec:
    environ = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    environ.update(env or {})
    return build_torchrun_spec(
        list(argv), selection, error_dir=tmp_path / "err", log_dir=kw.pop("log_dir", None), environ=environ, **kw
    )


def opt(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


# ---------------------------------------------------------------------------------------------- argv


def test_single_node_cpu_standalone_with_rank_wrapper(tmp_path):
    spec = spec_for(tmp_path, log_dir=tmp_path / "logs")
    a = spec.argv
    assert a[1:3] == ("-m", "torch.distributed.run")
    assert opt(a, "--nproc-per-node") == "2" and "--standalone" in a
    assert opt(a, "--log-dir") == str(tmp_path / "err") and opt(a, "--max-restarts") == "0"
    assert "--tee" not in a and "--redirects" not in a
    wrap = a[a.index("--no-python") + 1 :]
    assert wrap[1] == "-mpodguard.rank.wrap" and wrap[2] == "train.py"
    assert "--prefix=rank{rank}:" in wrap and f"--log-dir={tmp_path / 'logs'}" in wrap
    worker = wrap[wrap.index("--") + 1 :]
    assert worker[1:] == ("-u", "train.py") and os.path.basename(worker[0]).startswith("python")
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
    assert spec.env["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "err" / REPLY_FILE)
    assert spec.log_path == tmp_path / "logs" / "torchrun.log" and spec.name == "torchrun"


def test_gpus_by_uuid_nproc_is_selected_count_and_leased_port_is_the_workers_master_port(tmp_path):
    spec = spec_for(tmp_path, selection=gpus(3), master_port=29611, nproc=7)
    a = spec.argv
    assert opt(a, "--nproc-per-node") == "3"  # the selection wins over nproc (CPU only)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ",".join(g.visible_id for g in gpus(3).gpus)
    assert opt(a, "--rdzv-backend") == "static" and opt(a, "--master-port") == "29611"
    assert opt(a, "--master-addr") == "127.0.0.1" and opt(a, "--node-rank") == "0" and opt(a, "--nnodes") == "1"
    assert "--standalone" not in a and "--gpus=0,1,2" in a


def test_cpu_nproc_from_param_or_num_trainers(tmp_path):
    assert opt(spec_for(tmp_path, nproc=4).argv, "--nproc-per-node") == "4"
    assert opt(spec_for(tmp_path, env={"NUM_TRAINERS": "3"}).argv, "--nproc-per-node") == "3"


def test_instant_cluster_env_gives_c10d_multi_node(tmp_path):
    env = {
        "NUM_NODES": "2",
        "NODE_RANK": "1",
        "PRIMARY_ADDR": "10.65.0.2",
        "PRIMARY_PORT": "29400",
        "MASTER_PORT": "1111",
        "NODE_ADDR": "10.65.0.3",
        "NUM_TRAINERS": "8",
    }
    a = spec_for(tmp_path, selection=gpus(8), env=env, rdzv_backend="c10d").argv
    assert opt(a, "--nnodes") == "2" and opt(a, "--rdzv-backend") == "c10d"
    assert opt(a, "--rdzv-endpoint") == "10.65.0.2:29400"  # PRIMARY_PORT before MASTER_PORT
    assert opt(a, "--rdzv-id") == "podguard" and opt(a, "--rdzv-conf") == "is_host=false"
    assert opt(a, "--local-addr") == "10.65.0.3" and opt(a, "--nproc-per-node") == "8"
    assert "--standalone" not in a and "--node-rank" not in a  # c10d ignores it (and would warn)
    primary = spec_for(tmp_path, selection=gpus(8), env={**env, "NODE_RANK": "0"}, rdzv_backend="c10d").argv
    assert opt(primary, "--rdzv-conf") == "is_host=true"


def test_static_multi_node_ranks_follow_node_rank(tmp_path):
    env = {"NUM_NODES": "3", "NODE_RANK": "2", "PRIMARY_ADDR": "10.65.0.2", "PRIMARY_PORT": "29400"}
    a = spec_for(tmp_path, selection=gpus(2), env=env, rdzv_backend="static").argv
    assert opt(a, "--rdzv-backend") == "static" and opt(a, "--node-rank") == "2" and opt(a, "--nnodes") == "3"
    assert opt(a, "--master-addr") == "10.65.0.2" and opt(a, "--master-port") == "29400"
    with pytest.raises(UsageError, match="needs NODE_RANK"):
        spec_for(tmp_path, env={"NUM_NODES": "2", "PRIMARY_ADDR": "h"}, rdzv_backend="static")
    with pytest.raises(UsageError, match="'etcd' is not supported"):
        spec_for(tmp_path, rdzv_backend="etcd")


def test_explicit_args_take_precedence_and_master_names_are_fallbacks(tmp_path):
    env = {"NUM_NODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29333"}
    a = spec_for(tmp_path, env=env, rdzv_backend="c10d").argv
    assert opt(a, "--rdzv-endpoint") == "10.0.0.9:29333"
    a = spec_for(
        tmp_path, env=env, nnodes=4, node_rank=0, master_addr="fd00::1", master_port=29999, rdzv_id="j7",
        rdzv_backend="c10d",
    ).argv  # fmt: skip
    assert opt(a, "--nnodes") == "4" and opt(a, "--rdzv-endpoint") == "[fd00::1]:29999"
    assert opt(a, "--rdzv-id") == "j7" and opt(a, "--rdzv-conf") == "is_host=true"
    a = spec_for(tmp_path, env={"NUM_NODES": "2", "PRIMARY_ADDR": "h"}).argv
    assert opt(a, "--rdzv-endpoint") == "h:29500" and "--rdzv-conf" not in a  # no NODE_RANK: torch decides


@pytest.mark.parametrize(
    ("env", "kw", "needle"),
    [
        ({"NUM_NODES": "2", "NODE_RANK": "2", "PRIMARY_ADDR": "h"}, {}, "NODE_RANK=2 is out of range"),
        ({"NUM_NODES": "2", "NODE_RANK": "-1", "PRIMARY_ADDR": "h"}, {}, "NODE_RANK=-1"),
        ({"NUM_NODES": "0"}, {}, "NUM_NODES=0"),
        ({"NUM_NODES": "two"}, {}, "NUM_NODES='two' is not a whole number"),
        ({"NUM_NODES": "2", "NODE_RANK": "x1", "PRIMARY_ADDR": "h"}, {}, "NODE_RANK='x1'"),
        ({"NUM_NODES": "2", "PRIMARY_ADDR": "h", "PRIMARY_PORT": "70000"}, {}, "PRIMARY_PORT=70000"),
        ({"NUM_NODES": "2", "PRIMARY_ADDR": "h", "PRIMARY_PORT": "0"}, {}, "PRIMARY_PORT=0"),
        ({"NUM_NODES": "2", "PRIMARY_ADDR": "h", "MASTER_PORT": "80a"}, {}, "MASTER_PORT='80a'"),
        ({"NUM_NODES": "2", "NODE_RANK": "1"}, {}, "set PRIMARY_ADDR"),
        ({}, {"master_port": 0}, "--master-port=0"),
        ({}, {"node_rank": 1}, "--node-rank=1 is out of range"),
        ({"NUM_TRAINERS": "many"}, {}, "NUM_TRAINERS='many'"),
        ({}, {"max_restarts": -1}, "max_restarts=-1"),
        ({}, {"rank_prefix": "{nope}:"}, "rank prefix '{nope}:'"),
        ({}, {"rdzv_id": "a b"}, "--rdzv-id='a b'"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_value(tmp_path, env, kw, needle):
    with pytest.raises(UsageError) as info:
        spec_for(tmp_path, env=env, **kw)
    assert info.value.code == ExitCode.USAGE == 64
    assert needle in info.value.message and "\n" not in info.value.message


@pytest.mark.parametrize(
    ("argv", "kind", "tail"),
    [
        (["python", "x.py", "--lr", "1"], "script", ["x.py", "--lr", "1"]),
        (["x.py", "a"], "script", ["x.py", "a"]),
        (["python3", "-m", "pkg.train", "a"], "module", ["-m", "pkg.train", "a"]),
        (["bash", "run.sh", "a"], "program", ["--no-python", "bash", "run.sh", "a"]),
        (["python", "-u", "x.py"], "script", ["x.py"]),
    ],
)
def test_command_forms_for_plain_torchrun(argv, kind, tail):
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    cmd = classify_command(argv, env)
    assert cmd.kind == kind and cmd.torchrun_tail() == tail


def test_interpreter_options_and_dash_c_go_through_no_python():
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    cmd = classify_command(["python", "-O", "-X", "dev", "x.py"], env)
    assert cmd.kind == "script" and cmd.python_opts == ("-O", "-X", "dev")
    assert cmd.torchrun_tail()[0] == "--no-python" and cmd.torchrun_tail()[-4:] == ["-O", "-X", "dev", "x.py"]
    assert classify_command(["python", "-c", "print(1)"], env).kind == "program"


@pytest.mark.parametrize(
    "argv", [["torchrun", "x.py"], ["python", "-m", "torch.distributed.run", "x.py"], [], ["python", "-m"]]
)
def test_launching_torchrun_inside_torchrun_or_nothing_is_refused(argv):
    with pytest.raises(UsageError):
        classify_command(argv, {"PATH": os.path.dirname(sys.executable)})


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["accelerate", "launch", "--num_processes", "2", "train.py"], "accelerate launch"),
        (["/opt/venv/bin/deepspeed", "train.py"], "deepspeed"),
        (["lightning", "run", "model", "train.py"], "lightning's CLI"),
        (["fabric", "run", "train.py"], "Fabric"),
        (["python", "-m", "accelerate.commands.launch", "train.py"], "python -m accelerate.commands.launch"),
        (["python", "-m", "deepspeed.launcher.runner", "train.py"], "python -m deepspeed.launcher.runner"),
        (["mpirun", "-np", "2", "python", "train.py"], "mpirun"),
        (["accelerate-launch", "train.py"], "accelerate launch"),  # accelerate's own console script
        (["python", "/opt/venv/bin/accelerate", "launch", "train.py"], "accelerate launch"),
        (["deepspeed.pt", "train.py"], "deepspeed"),
        (["env", "NCCL_DEBUG=INFO", "torchrun", "train.py"], "torchrun"),  # behind a wrapper
        (["uv", "run", "--frozen", "accelerate", "launch", "train.py"], "accelerate launch"),
        (["nice", "-n", "5", "deepspeed", "train.py"], "deepspeed"),
    ],
)
def test_any_launcher_inside_torchrun_mode_is_refused_naming_it_and_what_to_do(argv, named):
    """Issue 23 item 14: `--mode torchrun -- accelerate launch ...` ran two launchers (4 processes, same work)."""
    with pytest.raises(UsageError) as err:
        classify_command(argv, {"PATH": os.path.dirname(sys.executable)})
    assert err.value.code == 64
    text = str(err.value)
    assert named in text and "--mode single -- " + argv[0] in text and "training script itself" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "deepspeed_train.py"],
        ["python", "-m", "my_accelerate_utils"],
        ["/opt/accelerate/bin/python", "train.py"],
        ["./deepspeed_train.py"],
        ["python", "accelerate.py"],
    ],
)
def test_a_script_or_module_that_only_sounds_like_a_launcher_is_not_refused(argv):
    assert classify_command(argv, {"PATH": os.path.dirname(sys.executable)}).kind in ("script", "module")


def test_a_wrapper_around_a_training_script_is_not_refused():
    for argv in (["env", "X=1", "python", "train.py"], ["nice", "-n", "5", "./train.sh"], ["uv", "run", "train.py"]):
        assert classify_command(argv, {"PATH": os.path.dirname(sys.executable)}).kind == "program"


def test_the_agent_and_so_every_rank_get_line_buffered_stdio_and_richs_tty_switches(tmp_path):
    env = spec_for(tmp_path, argv=["./native_trainer", "--steps", "9"]).env
    assert env["TTY_COMPATIBLE"] == env["TTY_INTERACTIVE"] == "1"
    if Path("/usr/libexec/coreutils/libstdbuf.so").exists():
        assert env["_STDBUF_O"] == "L" and env["LD_PRELOAD"].split(":")[0].endswith("libstdbuf.so")


def test_plain_mode_and_shutdown_timeout(tmp_path):
    a = spec_for(tmp_path, argv=[sys.executable, "-m", "pkg"], prefix_ranks=False, shutdown_timeout_s=5).argv
    assert a[-2:] == ("-m", "pkg") and "--no-python" not in a and opt(a, "--shutdown-timeout") == "5"


def test_torchrun_options_are_read_from_the_agents_own_torch(tmp_path, monkeypatch):
    """torch 2.11's torchrun has no --shutdown-timeout (exit 2 on a real H200): podguard passes only what the
    agent interpreter's torch accepts, read from its source in a child interpreter, torch not imported."""
    old_torch = tmp_path / "site" / "torch"
    (old_torch / "distributed").mkdir(parents=True)
    (old_torch / "__init__.py").write_text("raise SystemExit('imported torch')\n")
    (old_torch / "distributed" / "run.py").write_text('parser.add_argument("--max-restarts")\n')
    other_python = tmp_path / "python3"
    other_python.symlink_to(sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    assert not torchrun_accepts(str(other_python), "--shutdown-timeout")
    assert torchrun_accepts(str(other_python), "--max-restarts")
    assert not torchrun_accepts(str(tmp_path / "no-such-python"), "--max-restarts")
    if HAS_TORCH:  # this interpreter's own torch (2.13 here) has the option
        assert torchrun_accepts(sys.executable, "--shutdown-timeout")


def test_stale_reply_file_is_removed(tmp_path):
    (tmp_path / "err").mkdir()
    (tmp_path / "err" / REPLY_FILE).write_text("{}")
    spec_for(tmp_path)
    assert not (tmp_path / "err" / REPLY_FILE).exists()


def test_importing_launch_modules_does_not_import_torch():
    code = (
        "import sys, podguard.launch.torchrun.command, podguard.launch.torchrun.failure, podguard.launch.ports, "
        "podguard.preflight.leases, podguard.job.sweep, podguard.rank.wrap; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -------------------------------------------------------------------------------------- rank wrapper


def wrap(tmp_path: Path, code: str, rank: int = 3, **env: str) -> subprocess.CompletedProcess[bytes]:
    err = tmp_path / "run" / "attempt_0" / "1"
    err.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": "1",
        "GROUP_RANK": "0",
        "TORCHELASTIC_ERROR_FILE": str(err / "error.json"),
        **env,
    }
    argv = [sys.executable, "-mpodguard.rank.wrap", "t.py", "--prefix=rank{rank}/gpu{gpu}:"]
    argv += ["--gpus=4,5", f"--log-dir={tmp_path}", "--", sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(argv, env=full_env, capture_output=True, timeout=30)


def test_rank_wrapper_prefixes_whole_lines_and_mirrors_the_exit_code(tmp_path):
    code = """
        import sys, time
        sys.stdout.write("half "); sys.stdout.flush(); time.sleep(0.05); print("line")
        sys.stdout.write("\\r10%\\r20%\\r30%\\n"); sys.stdout.flush()
        print("x" * 10000)
        sys.stderr.write("problem é\\n"); sys.stdout.write("no newline at the end"); sys.exit(5)
    """
    proc = wrap(tmp_path, code)
    assert proc.returncode == 5
    lines = proc.stdout.decode().splitlines()
    assert all(line.startswith("rank3/gpu5:") for line in lines)
    body = [line.removeprefix("rank3/gpu5:") for line in lines]
    assert body[:4] == ["half line", "10%", "20%", "30%"] and body[-1] == "no newline at the end"
    assert "".join(body[4:-1]) == "x" * 10000 and all(len(line) + 1 <= 4096 for line in lines)
    assert proc.stderr.decode() == "rank3/gpu5:problem é\n"
    log = (tmp_path / "rank3.log").read_text()
    assert "x" * 10000 + "\n" in log and "half line\n" in log  # unprefixed, unsplit
    rec = json.loads((tmp_path / "run" / "attempt_0" / "1" / EXIT_FILE).read_text())
    assert rec["exitcode"] == 5 and rec["signal"] is None and rec["rank"] == 3 and rec["local_rank"] == 1
    assert rec["tail"][-1] == "no newline at the end"


def test_rank_wrapper_dies_by_the_workers_signal(tmp_path):
    proc = wrap(tmp_path, "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout == b"rank3/gpu5:bye\n"
    rec = json.loads((tmp_path / "run" / "attempt_0" / "1" / EXIT_FILE).read_text())
    assert rec["signal"] == signal.SIGKILL and rec["exitcode"] is None


def test_rank_wrapper_log_keeps_a_long_line_whole_when_it_arrives_in_pieces(tmp_path):
    """A line longer than one atomic terminal write is shown in prefixed pieces as it arrives (never held
    whole), but the log file gets it unsplit, whatever sizes the pipe delivered it in."""
    from collections import deque

    from podguard.rank.wrap import LineStream, RankLog

    log = RankLog(tmp_path / "rank0.log", warn=lambda text: None)
    r, w = os.pipe()
    stream = LineStream(w, b"rank0:", True, log, deque(maxlen=5))
    data = b"x" * 10000 + b"\nshort\r\nlast"
    for start in range(0, len(data), 3000):  # the pieces a busy pipe may deliver
        stream.feed(data[start : start + 3000])
    stream.feed(b"", final=True)
    log.close()
    os.close(w)
    shown = os.read(r, 1 << 20).splitlines()
    os.close(r)
    assert (tmp_path / "rank0.log").read_bytes() == b"x" * 10000 + b"\nshort\nlast\n"
    assert all(line.startswith(b"rank0:") and len(line) < 4096 for line in shown)
    assert b"".join(line.removeprefix(b"rank0:") for line in shown[:-2]) == b"x" * 10000


def test_rank_wrapper_tells_podguard_of_output_without_a_line_end_at_most_once_a_second(tmp_path):
    """Issue 30, item 2: a dot per step is held until its line ends (ranks never interleave mid-line); podguard
    hears that the rank wrote (ACTIVITY, nothing a terminal shows), and the log and the line stay whole."""
    from collections import deque

    from podguard.launch.lines import ACTIVITY
    from podguard.launch.printer import Printer
    from podguard.rank.wrap import LineStream, RankLog

    log = RankLog(tmp_path / "rank0.log", warn=lambda text: None)
    r, w = os.pipe()
    stream = LineStream(w, b"rank0:", True, log, deque(maxlen=5), activity=True)
    started = time.monotonic()
    while time.monotonic() - started < 2.5:
        stream.feed(b".")
        time.sleep(0.05)
    stream.feed(b"\n")
    log.close()
    os.close(w)
    relayed = os.read(r, 1 << 20)
    os.close(r)
    marks = relayed.count(ACTIVITY)
    assert 2 <= marks <= 4  # about one a second, not one per dot
    out = io.BytesIO()
    printer = Printer(out)
    seen: list[str] = []
    active: list[str] = []
    s = printer.add("torchrun", None, log_path=tmp_path / "torchrun.log")
    printer.watch_all(lambda name, line: seen.append(line))
    printer.watch_activity(active.append)
    for piece in relayed.splitlines(keepends=True):  # as the reads bring them (one mark per read at most)
        printer.feed(s, piece)
    printer.close(s)
    printer.finish()
    assert active == ["torchrun"] * marks
    dots = "rank0:" + "." * relayed.count(b".")
    assert seen == [dots] and out.getvalue().decode() == dots + "\n"
    assert (tmp_path / "torchrun.log").read_text() == dots + "\n"
    assert (tmp_path / "rank0.log").read_text() == dots.removeprefix("rank0:") + "\n"


def test_rank_wrapper_survives_a_full_log_volume_and_keeps_the_workers_code(tmp_path):
    """Issue 7, item 8: a full volume under the per-rank log must cost the log (one warning), never the job."""
    (tmp_path / "rank3.log").symlink_to("/dev/full")  # every write: ENOSPC
    proc = wrap(tmp_path, "import sys\nfor i in range(5000): print('line', i, 'x' * 100)\nsys.exit(5)")
    assert proc.returncode == 5  # the worker's own code, not a crashed wrapper's
    out = proc.stdout.decode().splitlines()
    assert len(out) == 5000 and out[-1].startswith("rank3/gpu5:line 4999")  # nothing lost on the terminal
    err = proc.stderr.decode()
    assert err.count("warning: log file") == 1 and "No space left on device" in err and "Traceback" not in err
    rec = json.loads((tmp_path / "run" / "attempt_0" / "1" / EXIT_FILE).read_text())
    assert rec["exitcode"] == 5


# ------------------------------------------------------------------------------- explain (synthetic)


def agent_outcome(tail=(), returncode=1, sig=None) -> JobOutcome:
    w = WorkerExit("torchrun", 4242, returncode, sig, tail=tuple(tail))
    return JobOutcome(exit_code=w.exit_code, workers=(w,), root_cause=w)


def attempt_dir(err: Path, local_rank: int) -> Path:
    d = err / "podguard_abc123" / "attempt_0" / str(local_rank)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_explain_from_exit_records_picks_the_earliest_failure(tmp_path):
    err = tmp_path / "err"
    rec = {"rank": 0, "local_rank": 0, "group_rank": 0, "nnodes": 1, "pid": 11}
    (attempt_dir(err, 0) / EXIT_FILE).write_text(json.dumps({**rec, "exitcode": None, "signal": 15, "time": 20.0}))
    rec = {"rank": 1, "local_rank": 1, "group_rank": 0, "nnodes": 1, "pid": 12, "tail": ["boom"]}
    (attempt_dir(err, 1) / EXIT_FILE).write_text(json.dumps({**rec, "exitcode": None, "signal": 9, "time": 10.0}))
    out = explain_torchrun_failure(agent_outcome(), err)
    assert out.exit_code == 128 + 9
    assert out.detail.startswith("rank 1 (local rank 1) was killed by signal 9 (SIGKILL)")
    assert out.root_cause is not None and out.root_cause.name == "rank1" and out.root_cause.signal == 9
    assert out.root_cause.tail == ("boom",) and out.workers[0].name == "torchrun"


def test_explain_from_reply_file_and_worker_error_file(tmp_path):
    err = tmp_path / "err"
    inner = {"message": "ValueError: bad", "extraInfo": {"py_callstack": "...", "timestamp": "1"}}
    (attempt_dir(err, 0) / "error.json").write_text(json.dumps({"message": {**inner, "message": "Other"}}))
    (attempt_dir(err, 1) / "error.json").write_text(json.dumps({"message": inner}))
    (err / REPLY_FILE).write_text(json.dumps({"message": {**inner, "errorCode": 7}}))
    out = explain_torchrun_failure(agent_outcome(), err)
    assert out.exit_code == 7 and out.detail.startswith("local rank 1 exited with code 7: ValueError: bad")


def test_explain_never_invents_a_code(tmp_path):
    out = explain_torchrun_failure(agent_outcome(tail=["RendezvousTimeoutError: timed out"]), tmp_path / "none")
    assert out.exit_code == 1
    assert "could" in out.detail and "exit code 1 kept" in out.detail and "RendezvousTimeoutError" in out.detail


def test_explain_agent_ended_by_a_signal(tmp_path):
    tail = ["Traceback ...", "...SignalException: Process 18697 got signal: 15"]
    out = explain_torchrun_failure(agent_outcome(tail=tail), tmp_path)
    assert out.exit_code == 143 and out.detail.startswith("torchrun was ended by signal 15 (SIGTERM)")


def test_explain_leaves_success_signals_and_other_codes_alone(tmp_path):
    for outcome in (
        agent_outcome(returncode=0),
        agent_outcome(returncode=None, sig=9),
        agent_outcome(returncode=2),
        JobOutcome(143, agent_outcome().workers, agent_outcome().root_cause, signal=15),
    ):
        assert explain_torchrun_failure(outcome, tmp_path) is outcome


# ------------------------------------------------------------------------------- real torchrun (slow)


def run_spec(spec: WorkerSpec) -> tuple[JobOutcome, str]:
    proc = subprocess.run(
        spec.argv,
        env={**os.environ, **spec.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
    )
    out = proc.stdout.decode(errors="replace")
    w = WorkerExit(
        spec.name, 0, proc.returncode if proc.returncode >= 0 else None, None, tail=tuple(out.splitlines()[-60:])
    )
    if proc.returncode < 0:
        w = WorkerExit(spec.name, 0, None, -proc.returncode, tail=w.tail)
    return JobOutcome(w.exit_code, (w,), root_cause=w if w.failed else None), out


RECORD_SCRIPT = """
import sys
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo")
    dist.barrier()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} ready", flush=True)
    if dist.get_rank() == 1:
        raise ValueError("bad batch 7")
    dist.barrier()  # rank 0 waits here until torchrun stops it

if __name__ == "__main__":
    try:
        main()
    except ValueError:
        sys.exit(3)  # the script's own convention: data errors exit 3
"""

PLAIN_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} MASTER_PORT={os.environ['MASTER_PORT']}", flush=True)
if rank == 1:
    time.sleep(0.2)
    print("rank 1 giving up", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torchrun_gloo_rank1_exit3_with_record(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RECORD_SCRIPT)
    err = tmp_path / "err"
    spec = build_torchrun_spec([sys.executable, str(script)], CPU, error_dir=err, log_dir=tmp_path / "logs")
    outcome, out = run_spec(spec)
    assert outcome.exit_code == 1, out  # what torchrun itself says

    explained = explain_torchrun_failure(outcome, err)
    assert explained.exit_code == 3, explained.detail
    assert explained.detail.startswith("rank 1 (local rank 1) exited with code 3: ValueError: bad batch 7")
    assert explained.root_cause is not None and explained.root_cause.name == "rank1"
    assert "rank0:rank 0 of 2 ready" in out.splitlines() and "rank1:rank 1 of 2 ready" in out.splitlines()
    assert (tmp_path / "logs" / "rank1.log").read_text().count("rank 1 of 2 ready") == 1
    reply = json.loads((err / REPLY_FILE).read_text())
    assert reply["message"]["errorCode"] == 3  # torch's own record of the code

    # without podguard's exit records the reply file alone still gives code 3 (rank from the summary)
    for rec in err.glob(f"*/attempt_*/*/{EXIT_FILE}"):
        rec.unlink()
    again = explain_torchrun_failure(outcome, err)
    assert again.exit_code == 3 and again.detail.startswith("rank 1 (local rank 1) exited with code 3: ValueError")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torchrun_rank1_exit3_without_record_plain_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SCRIPT)
    err = tmp_path / "err"
    with allocate_master_port(start=29800, lease_dir=tmp_path / "leases") as port:
        spec = build_torchrun_spec(
            [sys.executable, str(script)], CPU, error_dir=err, log_dir=None, prefix_ranks=False, master_port=port.port
        )
        outcome, out = run_spec(spec)
    assert outcome.exit_code == 1, out
    assert f"hello from rank 1 MASTER_PORT={port.port}" in out  # the leased port is the workers' port
    assert not list(err.glob("*/attempt_*/*/error.json")) and not (err / REPLY_FILE).exists()

    explained = explain_torchrun_failure(outcome, err)
    assert explained.exit_code == 3, explained.detail
    assert explained.detail.startswith("rank 1 (local rank 1) exited with code 3")
    assert "torchrun output" in explained.detail

    # the summary cut off the tail: nothing is invented
    cut = JobOutcome(1, (WorkerExit("torchrun", 1, 1, None, tail=("hello",)),), WorkerExit("torchrun", 1, 1, None))
    assert explain_torchrun_failure(cut, err).exit_code == 1


def test_a_hidden_ranks_long_line_is_still_written_in_atomic_pieces(tmp_path):
    """`--only-gpu` marks a hidden rank's lines with HIDDEN (19 bytes): the piece size left it out, so a long line's
    writes were PIPE_BUF + 19 bytes, no longer atomic, and could interleave with other ranks' lines mid-line."""
    import select
    import socket
    from collections import deque

    from podguard.launch.lines import HIDDEN
    from podguard.rank.wrap import PIPE_BUF, LineStream, RankLog

    log = RankLog(None, warn=lambda text: None)
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per write()
    with reader, writer:
        stream = LineStream(writer.fileno(), b"rank1:", False, log, deque(maxlen=5))
        stream.feed(b"y" * 3 * PIPE_BUF + b"\n", final=True)
        writes = []
        while select.select([reader], [], [], 0.2)[0]:
            writes.append(reader.recv(1 << 20))
    assert writes and all(len(data) <= PIPE_BUF for data in writes), [len(data) for data in writes]
    pieces = b"".join(writes).splitlines()
    assert all(piece.startswith(HIDDEN + b"rank1:") for piece in pieces)
    assert b"".join(piece.removeprefix(HIDDEN + b"rank1:") for piece in pieces) == b"y" * 3 * PIPE_BUF

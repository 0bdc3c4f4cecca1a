"""End to end, issue 25: `--checkpoints` hands each attempt the newest whole checkpoint, a new checkpoint is
progress for the crash-loop rule, and `--save-signal` asks the job to save before a billing guard ends it.
`podguard run` as a real subprocess on the fake node; the jobs write folders with a COMPLETED marker."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobproc import PODGUARD, run_podguard, script
from loadfactor import scaled
from podguard.outcome_lines import newest_checkpoint

pytestmark = pytest.mark.slow

SAVE = """
def save(step):
    ck = CKPT / f"step-{step}"
    ck.mkdir(parents=True)
    (ck / "state.dat").write_text(str(step))
    (ck / "COMPLETED").write_text("")
"""


@pytest.fixture
def node(cli_node):
    return cli_node


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def end_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if re.match(r"^podguard (train|run): END ", ln)]
    return line


def job(tmp_path: Path, name: str, body: str) -> str:
    head = "import os, signal, sys, time, pathlib\nCKPT = pathlib.Path(sys.argv[1])\n"
    return script(tmp_path, name, head + SAVE + body)


def test_a_crash_after_a_save_resumes_from_it_and_the_lines_name_the_checkpoints(node, tmp_path):
    ckpt = tmp_path / "ckpt"
    path = job(
        tmp_path,
        "crashes_once.py",
        """
print("resume", os.environ.get("PODGUARD_RESUME_FROM"), os.environ.get("PODGUARD_RESUME_STEP"), flush=True)
step = int(os.environ.get("PODGUARD_RESUME_STEP", "0")) + 10
save(step)
sys.exit(0 if step >= 20 else 3)
""",
    )
    proc = run_podguard(
        node, ["run", "--checkpoints", str(ckpt), "--restarts", "2", "--", sys.executable, path, str(ckpt)], cpu=True
    )
    out = said(proc)
    assert proc.returncode == 0, out[-3000:]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("resume")] == [
        "resume None None",
        f"resume {ckpt / 'step-10'} 10",
    ]
    assert f"podguard: no checkpoint yet in {ckpt}" in out
    assert re.search(
        rf"podguard: resuming from {re.escape(str(ckpt / 'step-10'))} \(step 10, written \d+(\.\d+)?s ago\)", out
    )
    restart = next(ln for ln in out.splitlines() if "RESTART 1 of 2" in ln)
    assert re.search(
        rf"newest checkpoint {re.escape(str(ckpt / 'step-10'))} \(step 10, written \S+Z\); started from scratch$",
        restart,
    )
    end = end_line(out)
    assert end.startswith(
        f"podguard run: END success exit 0 after 2 attempt(s): newest checkpoint {ckpt / 'step-20'} (step 20, written "
    )
    assert end.endswith(f"; started from {ckpt / 'step-10'}")
    parsed = newest_checkpoint(end)  # as `pod keep` reads it for its notifications
    assert parsed is not None and (parsed.path, parsed.step) == (str(ckpt / "step-20"), 20)
    assert abs(parsed.written - (ckpt / "step-20").stat().st_mtime) < 2
    (record,) = (tmp_path / "state" / "jobs").glob("*.json")  # the job record names them too
    first, second = [run["detail"] for run in json.loads(record.read_text())["history"]]
    assert first.startswith(f"newest checkpoint {ckpt / 'step-10'} (step 10, written ")
    assert "; started from scratch" in first
    assert f"started from {ckpt / 'step-10'}" in second
    runs = sorted((tmp_path / "state" / "runs").iterdir())
    assert json.loads((runs[1] / "checkpoints.json").read_text())["started_from"]["step"] == 10


def test_a_job_that_saves_then_crashes_three_times_is_not_a_crash_loop(node, tmp_path):
    ckpt = tmp_path / "ckpt"
    path = job(
        tmp_path,
        "saves_and_crashes.py",
        """
step = int(os.environ.get("PODGUARD_RESUME_STEP", "0")) + 1
save(step)
sys.exit(5)
""",
    )
    proc = run_podguard(
        node, ["run", "--checkpoints", str(ckpt), "--restarts", "3", "--", sys.executable, path, str(ckpt)], cpu=True
    )
    out = said(proc)
    assert proc.returncode == 5, out[-3000:]
    assert "crash loop" not in out
    assert "not restarting: all 3 restart(s) used (--restarts 3)" in out
    assert end_line(out).startswith("podguard run: END failed exit 5 after 4 attempt(s): newest checkpoint")
    # and without the saves, the same crashes are a crash loop
    plain = script(tmp_path, "crashes.py", "import sys\nsys.exit(5)\n")
    proc = run_podguard(
        node, ["run", "--checkpoints", str(tmp_path / "none"), "--restarts", "3", "--", sys.executable, plain], cpu=True
    )
    assert "crash loop: 3 attempts in a row failed the same way" in said(proc)


TRAINING = """
print("training", flush=True)
while True:
    time.sleep(0.05)
"""

SAVES_ON_SIGNAL = (
    """
def on_signal(*_):
    save(99)
    print("saved on the signal", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_signal)
"""
    + TRAINING
)

IGNORES_SIGNAL = (
    """
signal.signal(signal.SIGUSR1, lambda *_: print("ignoring the save request", flush=True))
"""
    + TRAINING
)


def test_max_runtime_with_save_signal_saves_then_ends_within_the_grace(node, tmp_path):
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "saves.py", SAVES_ON_SIGNAL)
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--max-runtime", "2s", "--save-grace", "20s"]
    t0 = time.monotonic()
    proc = run_podguard(node, [*args, "--", sys.executable, path, str(ckpt)], cpu=True)
    took = time.monotonic() - t0
    out = said(proc)
    assert proc.returncode == 124, out[-3000:]
    assert "saved on the signal" in out and (ckpt / "step-99" / "COMPLETED").exists()
    assert "asking the job to save before it is stopped: SIGUSR1 to 1 process(es)" in out
    guard = next(ln for ln in out.splitlines() if "not inside a RunPod pod" in ln)
    assert f"saved checkpoint {ckpt / 'step-99'} (step 99)" in guard
    assert end_line(out).startswith(
        f"podguard run: END guard exit 124 after 1 attempt(s): newest checkpoint {ckpt / 'step-99'}"
    )
    assert took < 15


def test_a_job_that_ignores_the_save_signal_is_ended_after_the_grace(node, tmp_path):
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "ignores.py", IGNORES_SIGNAL)
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "SIGUSR1", "--max-runtime", "1s", "--save-grace", "2s"]
    t0 = time.monotonic()
    proc = run_podguard(node, [*args, "--grace", "1", "--", sys.executable, path, str(ckpt)], cpu=True)
    took = time.monotonic() - t0
    out = said(proc)
    assert proc.returncode == 124, out[-3000:]
    assert "ignoring the save request" in out
    assert "no new whole checkpoint within the 2s save grace" in out
    assert 3 <= took < 20


def test_a_job_without_a_handler_dies_of_the_save_signal_and_no_save_is_claimed(node, tmp_path):
    """SIGUSR1's default action ends the process: the guard's line says so, the END line is the guard's."""
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "no_handler.py", TRAINING)
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--max-runtime", "1s", "--save-grace", "20s"]
    proc = run_podguard(node, [*args, "--", sys.executable, path, str(ckpt)], cpu=True)
    out = said(proc)
    assert proc.returncode == 124, out[-3000:]
    guard = next(ln for ln in out.splitlines() if "not inside a RunPod pod" in ln)
    assert "the job died of SIGUSR1 without saving: it has no handler for the save signal" in guard
    assert "saved checkpoint" not in out
    assert end_line(out).startswith("podguard run: END guard exit 124 after 1 attempt(s): no checkpoint yet;")


def test_a_shell_wrapper_passes_the_save_signal_to_the_training_process(node, tmp_path):
    """`bash train.sh` (and its `| tee`) would die of SIGUSR1: the python process below it gets the signal."""
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "saves.py", SAVES_ON_SIGNAL)
    wrapper = script(tmp_path, "train.sh", f"{sys.executable} {path} {ckpt} | tee {tmp_path / 'log'}\n")
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--max-runtime", "2s", "--save-grace", "20s"]
    proc = run_podguard(node, [*args, "--", "bash", wrapper], cpu=True)
    out = said(proc)
    assert proc.returncode == 124, out[-3000:]
    assert "SIGUSR1 to 1 process(es)" in out and "saved on the signal" in out
    assert f"saved checkpoint {ckpt / 'step-99'} (step 99)" in out
    assert "saved on the signal" in (tmp_path / "log").read_text()  # tee lived on


def test_idle_stop_with_save_signal_asks_the_idle_job_to_save_first(node, tmp_path):
    """The idle guard (the fake node's GPUs at 0 %) takes the same path as --max-runtime: save, then end."""
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "saves.py", SAVES_ON_SIGNAL)
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--idle-stop", "1s", "--save-grace", "20s"]
    env = {"PODGUARD_GUARD_INTERVAL": "0.1"}
    proc = run_podguard(node, [*args, "--", sys.executable, path, str(ckpt)], env=env)
    out = said(proc)
    assert proc.returncode == 124, out[-3000:]
    guard = next(ln for ln in out.splitlines() if "not inside a RunPod pod" in ln)
    assert guard.startswith("podguard: billing guard --idle-stop: every GPU at or below 5 % utilisation")
    assert f"saved checkpoint {ckpt / 'step-99'} (step 99)" in guard


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--save-signal", "KILL"], {}, "--save-signal='KILL' is not valid"),
        (["--save-signal", "USR9"], {}, "--save-signal='USR9' is not valid"),
        ([], {"PODGUARD_SAVE_SIGNAL": "bogus"}, "--save-signal='bogus' is not valid"),
        (["--save-grace", "0"], {}, "--save-grace='0' is not valid"),
        (["--save-grace", "soon"], {}, "--save-grace='soon' is not valid; expected a duration > 0"),
        (["--save-signal", "USR1", "--no-ckpt"], {}, "--save-signal needs --checkpoints DIR"),
        (["--checkpoints", "FILE"], {}, "is not a folder"),
        # `--checkpoints $CKPT_DIR` with the variable unset: not the current folder (an unrelated
        # pretrained_init.pt there became the resume point), and the same for the variable
        (["--checkpoints", ""], {}, "--checkpoints='' is empty (an unset variable?)"),
        (["--checkpoints", "  "], {}, "--checkpoints='  ' is empty (an unset variable?)"),
        (["--no-ckpt"], {"PODGUARD_CHECKPOINTS": ""}, "PODGUARD_CHECKPOINTS='' is empty (an unset variable?)"),
        ([], {"PODGUARD_CHECKPOINTS": "FILE"}, "is not a folder"),
    ],
)
def test_bad_values_are_64_before_anything_runs(node, tmp_path, args, env, needle):
    marker = tmp_path / "ran"
    (tmp_path / "file").write_text("")
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    env = {k: str(tmp_path / "file") if v == "FILE" else v for k, v in env.items()}
    if "--no-ckpt" in args:
        args.remove("--no-ckpt")
    elif "--checkpoints" not in args and "PODGUARD_CHECKPOINTS" not in env:
        args = ["--checkpoints", str(tmp_path / "ckpt"), *args]
    proc = run_podguard(node, ["run", *args, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], env=env)
    assert proc.returncode == 64, said(proc)
    assert needle in said(proc) and "Traceback" not in said(proc)
    assert not marker.exists() and not (tmp_path / "state" / "runs").exists()


# A save request that comes before a rank's handler exists would kill it (SIGUSR1's default action), and on a busy
# machine importing torch can outlast --max-runtime: blocked first thing, the request waits for the handler.
TORCHRUN_SAVES = """
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
def on_signal(*_):
    if rank == 0:
        save(42)
    print(f"rank {rank} saved on the signal", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_signal)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # the handler is in place: an early request lands
print(f"rank {rank} training", flush=True)
while True:
    time.sleep(0.05)
"""


def test_in_torchrun_mode_the_ranks_get_the_save_signal_and_torchrun_survives_it(node, tmp_path):
    """The ranks must exist when --max-runtime comes (podguard asks the processes torchrun has started): 6 s on an
    idle machine, stretched by the load factor, as torchrun imports torch before it starts them. The save grace is
    a deadline (podguard ends the wait as soon as the checkpoint is whole)."""
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "ddp.py", TORCHRUN_SAVES)
    args = ["train", "--mode", "torchrun", "--cpu-workers", "2", "--checkpoints", str(ckpt), "--save-signal", "USR1"]
    args += ["--max-runtime", f"{scaled(6):.0f}s", "--grace", "2", "--save-grace", f"{scaled(60):.0f}s"]
    proc = run_podguard(node, [*args, "--", sys.executable, path, str(ckpt)], cpu=True)
    out = said(proc)
    assert proc.returncode == 124, out[-3000:]
    assert "SIGUSR1 to 2 process(es)" in out
    assert "rank 0 saved on the signal" in out and "rank 1 saved on the signal" in out
    assert f"saved checkpoint {ckpt / 'step-42'} (step 42)" in out


TERM_JOB = """
signal.signal(signal.SIGUSR1, lambda *_: print("save request", flush=True))
def on_term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
"""


def sigterm_once(node, args: list[str], path: str, ckpt: Path, after: str) -> tuple[str, float]:
    """`podguard ARGS -- job`, SIGTERM to podguard (as RunPod stops a pod) once `after` is printed: (output,
    seconds from the SIGTERM to podguard's exit)."""
    env = {**node.env, "LD_LIBRARY_PATH": ""}
    with subprocess.Popen(
        [*PODGUARD, *args, "--", sys.executable, "-u", path, str(ckpt)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == after:
                break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    return "".join(lines) + rest, took


def test_runpods_sigterm_is_forwarded_at_once_without_a_save_request(node, tmp_path):
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "term.py", TERM_JOB + TRAINING)
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--max-runtime", "1h"]
    out, took = sigterm_once(node, args, path, ckpt, "training")
    assert "got SIGTERM" in out and "save request" not in out and "asking the job to save" not in out
    assert took < 5


def test_runpods_sigterm_during_the_save_wait_is_forwarded_at_once(node, tmp_path):
    """The guard asked for a save (grace 60 s) and the job is slow: RunPod's stop does not wait for it."""
    ckpt = tmp_path / "ckpt"
    path = job(tmp_path, "term.py", TERM_JOB + TRAINING)
    args = ["run", "--checkpoints", str(ckpt), "--save-signal", "USR1", "--max-runtime", "1s", "--save-grace", "60s"]
    out, took = sigterm_once(node, args, path, ckpt, "save request")
    assert "got SIGTERM" in out and "received SIGTERM: forwarding it to 1 worker(s)" in out
    assert took < 5


@pytest.fixture
def unprivileged(tmp_path):
    """(a folder an unprivileged user may walk to, the command prefix that runs as that user, its environment):
    root reads everything, so `setpriv` drops to nobody; no NVML (the workers run on CPU)."""
    import os
    import shutil
    import tempfile

    if os.geteuid() != 0:
        root, prefix = tmp_path, []
    elif shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a folder unreadable")
    else:
        root, prefix = Path(tempfile.mkdtemp(prefix="podguard-perm-")), ["setpriv", "--reuid=65534", "--regid=65534"]
        prefix.append("--clear-groups")
        root.chmod(0o777)
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "PODGUARD_STATE_DIR": str(root / "state")}
    env |= {"PODGUARD_PROBE": "off", "LD_LIBRARY_PATH": "", "PODGUARD_DEV_DIR": str(root / "dev")}
    (root / "dev").mkdir()
    try:
        yield root, prefix, env
    finally:
        if root != tmp_path:
            for p in [root, *root.rglob("*")]:
                if not p.is_symlink():
                    p.chmod(0o755)
            shutil.rmtree(root)


@pytest.mark.parametrize("where", ["the folder", "its parent"])
def test_a_dir_podguard_may_not_list_is_a_warning_before_each_attempt_and_a_start_from_scratch(unprivileged, where):
    """A DIR that podguard may not list (mode 0, or under a folder this user may not enter) is never 64: each
    attempt is told so, and the job starts from scratch."""
    root, prefix, env = unprivileged
    ckpt = root / "locked" / "ckpt" if where == "its parent" else root / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "step-5.pt").write_bytes(b"")
    (ckpt if where == "the folder" else ckpt.parent).chmod(0)
    args = ["run", "--checkpoints", str(ckpt), "--restarts", "1", "--", "sh", "-c", JOB_FAILS_ONCE]
    proc = subprocess.run([*prefix, *PODGUARD, *args], env=env, capture_output=True, text=True, timeout=120)
    out = said(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    warning = f"podguard: warning: cannot read --checkpoints {ckpt} (Permission denied): starting from scratch"
    assert [ln for ln in out.splitlines() if ln.startswith("podguard: warning: cannot read")] == [warning] * 2
    assert [ln for ln in out.splitlines() if ln.startswith("attempt")] == ["attempt 0 None", "attempt 1 None"]
    assert "podguard: no checkpoint yet" not in out  # (the warning says it instead)


# (a shell, not this venv's python: the unprivileged user may not stat an interpreter under /root)
JOB_FAILS_ONCE = (
    'echo attempt $PODGUARD_RESTART_COUNT ${PODGUARD_RESUME_FROM:-None}; [ "$PODGUARD_RESTART_COUNT" != 0 ]'
)

"""Supervision stays on time whatever the output sinks do (issue 7: items 12, 14 and 8's log part).

* a stalled stdout or a stalled log file must not delay signal forwarding, reaping or the kill deadline;
* a signal arriving while the supervisor installs its handlers is not lost;
* a log file that cannot be created or written costs that log (one warning), never the job.

Issue 23: a C program's steps, dots without line ends and the lines of ranks `--only-gpu` hides all reach the
watch and the log files (end to end, `podguard` as a subprocess on CPU).
"""

from __future__ import annotations

import fcntl
import importlib.util
import io
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import pytest

from jobproc import PODGUARD, run_podguard, script
from loadfactor import load_factor
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec

HELPER = Path(__file__).with_name("_launch_helper.py")
PY = sys.executable

# Floods its stdout forever; records SIGTERM (with the time it arrived) and ignores it: only SIGKILL ends it.
FLOOD = textwrap.dedent(
    """
    import os, signal, sys, time
    d = sys.argv[1]
    def on_term(num, frame):
        with open(os.path.join(d, "term.tmp"), "w") as fh:
            fh.write(repr(time.time()))
        os.rename(os.path.join(d, "term.tmp"), os.path.join(d, "term"))
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(d, "pid.tmp"), "w").write(str(os.getpid()))
    os.rename(os.path.join(d, "pid.tmp"), os.path.join(d, "pid"))
    line = ("x" * 200 + "\\n").encode()
    while True:
        os.write(1, line * 50)
    """
)


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _pending(fd: int) -> int:
    """Bytes waiting unread in a pipe or FIFO (FIONREAD)."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def _full(fd: int) -> bool:
    """The pipe holds a lot and has stopped growing: its writer (podguard) is stuck on it or gave up."""
    before = _pending(fd)
    time.sleep(0.2)
    return before >= 32768 and _pending(fd) == before


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone between the open and the read: reaped
        return True


@pytest.mark.parametrize("stalled", ["stdout", "logfile"])
def test_a_stalled_sink_does_not_delay_forwarding_reaping_or_the_kill_deadline(tmp_path: Path, stalled: str):
    grace = 1.0
    spec: dict[str, object] = {"name": "GPU0", "argv": [PY, "-c", FLOOD, str(tmp_path)], "prefix": "GPU0:"}
    reader = None
    if stalled == "logfile":  # a log "volume" that accepts nothing more: a FIFO whose reader never reads
        fifo = tmp_path / "GPU0.log"
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        spec["log"] = str(fifo)
    config = {
        "specs": [spec],
        "grace": grace,
        "out": "-" if stalled == "stdout" else str(tmp_path / "out.txt"),
        "result": str(tmp_path / "result.json"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = subprocess.Popen([PY, str(HELPER), str(tmp_path / "config.json")], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    sink = proc.stdout.fileno() if stalled == "stdout" else reader
    assert sink is not None
    try:
        _wait(lambda: (tmp_path / "pid").exists(), 30, "the worker")
        pid = int((tmp_path / "pid").read_text())
        _wait(lambda: _full(sink), 30, "the sink to fill up")  # nobody reads it any more

        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        _wait(lambda: (tmp_path / "term").exists(), 5, "SIGTERM to reach the worker")
        assert float((tmp_path / "term").read_text()) - sent < 1.0  # forwarded at once

        _wait(lambda: _gone(pid), grace + 5, "the worker to be killed")
        killed_after = time.time() - sent
        assert grace - 0.1 <= killed_after < grace + 2.0  # SIGKILL on the deadline, not when the sink moves

        assert proc.wait(timeout=10) == 143  # podguard gives up on the stalled sink and exits on its own
        assert time.time() - sent < grace + 6.0
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["exit_code"] == 143 and result["signal"] == signal.SIGTERM
        (worker,) = result["workers"]
        assert worker["signal"] == signal.SIGKILL and worker["stopped_by_podguard"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if reader is not None:
            os.close(reader)


def test_a_signal_arriving_while_the_handlers_are_installed_is_not_lost(monkeypatch: pytest.MonkeyPatch):
    """SIGTERM lands right after the supervisor's SIGTERM handler is installed (the window between
    handlers and wakeup fd when they are set in the wrong order): the job must still be stopped."""
    real_signal = signal.signal
    fired: list[int] = []

    def install(signum, handler):
        old = real_signal(signum, handler)
        if signum == signal.SIGTERM and callable(handler) and not fired:
            fired.append(signum)
            signal.raise_signal(signal.SIGTERM)  # delivered now, inside the window
        return old

    monkeypatch.setattr(signal, "signal", install)
    worker = WorkerSpec("w", (PY, "-c", "import time; time.sleep(5)"))
    t0 = time.monotonic()
    outcome = run_job([worker], grace_s=1.0, terminal=io.BytesIO(), summary=False)
    assert fired
    assert outcome.exit_code == 128 + signal.SIGTERM and outcome.signal == signal.SIGTERM
    assert time.monotonic() - t0 < 4  # not the worker's 5 s


def test_full_log_volume_costs_the_log_with_one_warning_never_the_job(tmp_path: Path):
    log = tmp_path / "GPU0.log"
    log.symlink_to("/dev/full")  # every write: ENOSPC
    code = "import sys\nfor i in range(3000): print('line', i, 'x' * 100)\nsys.exit(3)"
    out = io.BytesIO()
    outcome = run_job([WorkerSpec("GPU0", (PY, "-c", code), prefix="GPU0:", log_path=log)], terminal=out, summary=False)
    assert outcome.exit_code == 3  # the job's own code wins
    lines = out.getvalue().decode().splitlines()
    assert sum(1 for line in lines if line.startswith("GPU0:line ")) == 3000  # the terminal copy is complete
    warnings = [line for line in lines if "warning: log file" in line]
    assert len(warnings) == 1 and str(log) in warnings[0] and "No space left on device" in warnings[0]


def test_log_folder_that_cannot_be_created_costs_the_log_not_the_job(tmp_path: Path):
    (tmp_path / "logs").write_text("a file where the log folder should be")
    out = io.BytesIO()
    spec = WorkerSpec("GPU0", (PY, "-c", "print('hello')"), prefix="GPU0:", log_path=tmp_path / "logs" / "GPU0.log")
    outcome = run_job([spec], terminal=out, summary=False)
    assert outcome.exit_code == 0
    text = out.getvalue().decode()
    assert "GPU0:hello" in text and text.count("warning: log file") == 1 and "cannot be opened" in text


# ---------------------------------------------------------------------------------------------------------------
# Issue 23: every line reaches the watch and the logs, whatever program prints it and whatever the terminal shows.

STEPS_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++) { printf("step %d\n", i); usleep(300000); }
    if (argc > 2) sleep(120);  /* then stuck: only a kill ends it */
    return 0;
}
"""


def _compile_steps(tmp_path: Path) -> str:
    src = tmp_path / "steps.c"
    src.write_text("#include <stdlib.h>\n" + STEPS_C)
    exe = tmp_path / "steps"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    return str(exe)


def _said(proc) -> str:
    return proc.stdout + proc.stderr


needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@pytest.mark.slow
@needs_gcc
def test_a_c_program_printing_steps_on_a_pipe_is_not_hung(cli_node, tmp_path: Path):
    """stdout on a pipe is block-buffered in C: without line buffering nothing arrives for 4 KiB (was: 79)."""
    exe = _compile_steps(tmp_path)
    proc = run_podguard(cli_node, ["run", "--hang-timeout", "2", "--", exe, "12"], cpu=True)
    assert proc.returncode == 0, _said(proc)[-2000:]
    assert "HUNG" not in _said(proc) and "step 11" in proc.stdout


@pytest.mark.slow
@needs_gcc
def test_a_c_programs_lines_arrive_while_it_runs_and_survive_a_kill(cli_node, tmp_path: Path):
    exe = _compile_steps(tmp_path)
    env = {**cli_node.env, "LD_LIBRARY_PATH": ""}
    proc = subprocess.Popen(
        [*PODGUARD, "run", "--grace", "1", "--", exe, "3", "stuck"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while b"step 2\n" not in seen and time.monotonic() < deadline:
            os.set_blocking(proc.stdout.fileno(), False)
            select.select([proc.stdout], [], [], 0.2)
            seen += proc.stdout.read() or b""
        assert b"step 0\nstep 1\nstep 2\n" in seen  # while it runs (it then sleeps for 2 minutes)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    (log,) = (tmp_path / "state" / "runs").glob("*/logs/job.log")
    assert log.read_text().splitlines()[:3] == ["step 0", "step 1", "step 2"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "torchrun"])
def test_dots_without_line_ends_are_progress_when_no_pattern_is_given(cli_node, tmp_path: Path, mode: str):
    """Issue 30, item 2: in torchrun mode the rank wrapper holds a partial line until its end (ranks never
    interleave mid-line): the dots reached podguard only as one line at the end, and the job was called hung."""
    # (torchrun's agent and its rank start slower, and silently: a longer timeout, and dots for longer than it,
    # both stretched by the load factor)
    factor = load_factor()
    dots, hang = (14, "2") if mode == "run" else (math.ceil(40 * factor), f"{8 * factor:.1f}")
    job = script(
        tmp_path,
        "dots.py",
        f"import sys, time\nfor _ in range({dots}):\n    sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.3)\n",
    )
    how = ["run"] if mode == "run" else ["train", "--mode", "torchrun", "--cpu-workers", "1"]
    proc = run_podguard(cli_node, [*how, "--hang-timeout", hang, "--", PY, job], cpu=True)
    assert proc.returncode == 0, _said(proc)[-2000:]
    assert "." * dots in proc.stdout
    assert "podguard-activity" not in _said(proc)  # the wrapper's marks go nowhere but the watch
    logs = [p.read_text() for p in (tmp_path / "state" / "runs").glob("*/logs/*.log")]
    assert any("." * dots in text for text in logs) and not any("podguard-activity" in text for text in logs)
    # with a --progress pattern, dots match nothing: the hang rule stands
    proc = run_podguard(cli_node, [*how, "--hang-timeout", hang, "--progress", "^step", "--", PY, job], cpu=True)
    assert proc.returncode == 79, _said(proc)[-2000:]


SILENT_RANK0 = """
import os, time
rank = int(os.environ["RANK"])
for i in range(16):
    if rank == 1:
        print(f"step {i}", flush=True)
    time.sleep(0.4)
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_only_gpu_in_torchrun_mode_filters_the_terminal_only(cli_node, tmp_path: Path):
    """Rank 0 (shown) prints nothing; rank 1 (hidden) prints steps: not hung (was: 79), its lines in the logs."""
    # torchrun's silent start-up: the hang timeout (5 s on an idle machine) and rank 1's steps (16, past it)
    # stretched alike by the load factor
    factor = load_factor()
    steps = math.ceil(16 * factor)
    job = script(tmp_path, "silent.py", SILENT_RANK0.replace("range(16)", f"range({steps})"))
    hang = f"{5 * factor:.1f}"
    args = ["train", "--mode", "torchrun", "--cpu-workers", "2", "--only-gpu", "0", "--hang-timeout", hang]
    proc = run_podguard(cli_node, [*args, "--", PY, job], cpu=True)
    assert proc.returncode == 0, _said(proc)[-3000:]
    assert "step" not in proc.stdout  # the terminal shows rank 0 only
    (logs,) = (tmp_path / "state" / "runs").glob("*/logs")
    assert (logs / "rank1.log").read_text().splitlines() == [f"step {i}" for i in range(steps)]
    torchrun_log = (logs / "torchrun.log").read_text()
    assert f"rank1:step {steps - 1}" in torchrun_log and "\x1b]" not in torchrun_log


def test_a_leftover_is_named_once():
    """A failing job leaves a background process (one that outlives a SIGTERM): it was named twice ("SIGTERM to
    leftover ..." while stopping, then "stopping leftover ..." when the cleanup began); once now."""
    out = io.BytesIO()
    stubborn = f"{PY} -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)'"
    job = f"{stubborn} & echo $! ; sleep 0.3; exit 3"
    outcome = run_job([WorkerSpec("job", ("bash", "-c", job))], terminal=out, grace_s=1.0)
    assert outcome.exit_code == 3
    said = out.getvalue().decode()
    pid = said.splitlines()[0].strip()
    named = [line for line in said.splitlines() if "leftover" in line and pid in line]
    assert len(named) == 1, said


RICH_STEPS = """
import time
from rich.console import Console
console = Console()
for i in range(10):
    console.print(f"step {i} loss 0.5")
    time.sleep(0.3)
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="rich is not installed")
def test_a_rich_console_under_podguards_tty_switches_still_matches_the_progress_pattern(cli_node, tmp_path: Path):
    """podguard's TTY_COMPATIBLE=1 makes rich colour every number (`step ESC[1;36m5ESC[0m`): the watch and the
    log file get plain text, so `--progress 'step (\\d+)'` still matches (was: no match, a false hang, 79)."""
    job = script(tmp_path, "rich_steps.py", RICH_STEPS)
    args = ["run", "--hang-timeout", "2", "--progress", r"^step (\d+) loss"]
    proc = run_podguard(cli_node, [*args, "--", PY, job], cpu=True)
    assert proc.returncode == 0, _said(proc)[-2000:]
    assert "step 9 loss 0.5" in proc.stdout and "\x1b[" not in proc.stdout  # a pipe (container logs): plain text
    (log,) = (tmp_path / "state" / "runs").glob("*/logs/job.log")
    assert log.read_text().splitlines() == [f"step {i} loss 0.5" for i in range(10)]


RICH_STALL = """
import time
from rich.progress import track
for i in track(range(10), description="train"):
    time.sleep(0.2 if i < 3 else 30)
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="rich is not installed")
def test_a_stalled_rich_bar_redrawing_the_same_frame_is_a_hang(cli_node, tmp_path: Path):
    """rich's refresh thread redraws a stalled `track()` bar 10 times a second: identical redraws were lines,
    so activity, and the hung job ran on (was: no verdict; the job ended on its own after 30 s)."""
    job = script(tmp_path, "rich_stall.py", RICH_STALL)
    started = time.monotonic()
    proc = run_podguard(cli_node, ["run", "--hang-timeout", "2", "--grace", "1", "--", PY, job], cpu=True)
    assert proc.returncode == 79, _said(proc)[-2000:]
    assert time.monotonic() - started < 25
    (log,) = (tmp_path / "state" / "runs").glob("*/logs/job.log")
    bars = log.read_text().splitlines()
    assert len(bars) == len(set(bars)) and any("30%" in bar for bar in bars)  # each bar once, none repeated

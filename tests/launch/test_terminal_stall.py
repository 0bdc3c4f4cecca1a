"""The terminal never holds the watch back (issue 30, item 4): podguard's stdout is a FIFO nobody reads (a log
collector that stopped reading, a terminal paused with Ctrl-S). The workers are still read and logged in full, what
stdout missed is counted and said once, and the HUNG, summary and END lines also reach stderr.

`podguard run` as a real subprocess whose stdout is the write end of a real FIFO; the console's rules alone on top
(launch/console.py)."""

from __future__ import annotations

import io
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobproc import PODGUARD, script
from podguard.launch.console import Console

pytestmark = pytest.mark.slow

# ~1 MB/s of lines for `seconds`, then "done": a chatty job that blocks in print() once nobody takes its output.
CHATTY = """
    import sys, time
    seconds, then = float(sys.argv[1]), sys.argv[2]
    line = "x" * 100
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        sys.stdout.write("".join(f"line {n + i} {line}\\n" for i in range(100)))
        sys.stdout.flush()
        n += 100
        time.sleep(0.01)
    print(f"done {n}", flush=True)
    if then == "hang":
        time.sleep(3600)
    """


def _podguard_on_a_stalled_fifo(tmp_path: Path, node, args: list[str]) -> tuple[int, str, float]:
    """podguard ARGS with its stdout on a FIFO that is never read; (exit code, stderr, seconds)."""
    fifo = tmp_path / "collector.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads: writes block once it is full
    writer = os.open(fifo, os.O_WRONLY)
    env = {**node.env, "LD_LIBRARY_PATH": ""}
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [*PODGUARD, *args], env=env, stdin=subprocess.DEVNULL, stdout=writer, stderr=subprocess.PIPE,
            text=True, timeout=150,
        )  # fmt: skip
    finally:
        os.close(writer)
        os.close(reader)
    return proc.returncode, proc.stderr, time.monotonic() - started


def _log_lines(tmp_path: Path) -> list[str]:
    (run,) = sorted((tmp_path / "state" / "runs").iterdir())
    (log,) = sorted((run / "logs").glob("*.log"))
    return log.read_text().splitlines()


def test_a_chatty_job_on_a_stalled_stdout_is_read_and_logged_in_full_and_never_called_hung(tmp_path, cli_node):
    job = script(tmp_path, "chatty.py", CHATTY)
    code, err, _ = _podguard_on_a_stalled_fifo(
        tmp_path, cli_node, ["run", "--hang-timeout", "8", "--grace", "2", "--", sys.executable, job, "20", "exit"]
    )
    assert code == 0, err[-3000:]
    assert "podguard: HUNG" not in err
    lines = _log_lines(tmp_path)
    done = lines[-1]
    assert done.startswith("done ")
    assert len(lines) == int(done.split()[1]) + 1  # every line, in the log file
    assert [ln for ln in lines if ln.startswith("line ")][-1].startswith(f"line {int(done.split()[1]) - 1} ")
    warned = [ln for ln in err.splitlines() if "stdout is not being read" in ln]
    assert len(warned) == 1, err[-3000:]
    (missed,) = [ln for ln in err.splitlines() if "stdout missed" in ln]  # said once
    assert int(missed.split("missed ")[1].split()[0]) > 1000


def test_a_hung_job_on_a_stalled_stdout_ends_79_with_the_hung_and_summary_lines_on_stderr(tmp_path, cli_node):
    job = script(tmp_path, "chatty.py", CHATTY)
    code, err, took = _podguard_on_a_stalled_fifo(
        tmp_path, cli_node, ["run", "--hang-timeout", "8", "--grace", "2", "--", sys.executable, job, "6", "hang"]
    )
    assert code == 79, err[-3000:]
    assert took < 6 + 8 + 60
    assert "podguard: HUNG: no progress for " in err, err
    assert "podguard: job: chatty.py:13 in <module>" in err  # the hang summary
    assert "podguard: job hung; stopping 1 worker(s)" in err
    assert "podguard: job hung; exit 79" in err  # the job's summary
    assert "podguard run: END hung exit 79" in err
    assert _log_lines(tmp_path)[-1].startswith("done ")


# ---------------------------------------------------------------------------------------------------------------
# the console's rules alone


def test_a_slow_terminal_that_moves_is_back_pressure_not_a_stall(tmp_path: Path) -> None:
    r, w = os.pipe()
    err = io.BytesIO()
    console = Console(w, err=err, background=True, stall_s=0.5)
    try:
        console.show([b"x" * 100 + b"\n"] * 2000)  # 200 KB: more than the pipe holds
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # a reader that takes 16 KB every 0.1 s
            if select.select([r], [], [], 0)[0]:
                os.read(r, 16384)
            time.sleep(0.1)
            console.check()
            assert not console.stalled
        assert console.missed_lines == 0
    finally:
        os.close(r)
        console.close(stall_s=0.2, cap_s=0.5)
        os.close(w)


def test_a_loud_line_waiting_in_a_stalled_stdout_goes_to_stderr(tmp_path: Path) -> None:
    r, w = os.pipe()
    err_r, err_w = os.pipe()
    console = Console(w, err=err_w, background=True, stall_s=0.3)
    try:
        console.show([b"y" * 100 + b"\n"] * 2000)  # fills the pipe: nobody reads it
        console.say(b"podguard: HUNG: no progress for 8s\n", loud=True)
        console.say(b"podguard: a quiet line\n")
        deadline = time.monotonic() + 5
        while not console.stalled and time.monotonic() < deadline:
            time.sleep(0.05)
            console.check()
        assert console.stalled
        console.show([b"z\n"] * 10)
        assert console.missed_lines == 10
        console.say(b"podguard: job hung\n", loud=True)
        console.close(stall_s=0.2, cap_s=0.5)
        os.close(err_w)
        said = b""
        while chunk := os.read(err_r, 65536):
            said += chunk
    finally:
        os.close(r)
        os.close(w)
        os.close(err_r)
    lines = said.decode().splitlines()
    assert lines[0].startswith("podguard: warning: stdout is not being read")
    assert "podguard: HUNG: no progress for 8s" in lines and "podguard: job hung" in lines
    assert "podguard: a quiet line" not in lines
    assert sum("stdout missed 10 line(s)" in ln for ln in lines) == 1

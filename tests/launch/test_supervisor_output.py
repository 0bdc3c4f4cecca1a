"""Supervision stays on time whatever the output sinks do (issue 7: items 12, 14 and 8's log part).

* a stalled stdout or a stalled log file must not delay signal forwarding, reaping or the kill deadline;
* a signal arriving while the supervisor installs its handlers is not lost;
* a log file that cannot be created or written costs that log (one warning), never the job.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import pytest

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
    outcome = run_job([worker], grace_s=1.0, out=io.BytesIO(), summary=False)
    assert fired
    assert outcome.exit_code == 128 + signal.SIGTERM and outcome.signal == signal.SIGTERM
    assert time.monotonic() - t0 < 4  # not the worker's 5 s


def test_full_log_volume_costs_the_log_with_one_warning_never_the_job(tmp_path: Path):
    log = tmp_path / "GPU0.log"
    log.symlink_to("/dev/full")  # every write: ENOSPC
    code = "import sys\nfor i in range(3000): print('line', i, 'x' * 100)\nsys.exit(3)"
    out = io.BytesIO()
    outcome = run_job([WorkerSpec("GPU0", (PY, "-c", code), prefix="GPU0:", log_path=log)], out=out, summary=False)
    assert outcome.exit_code == 3  # the job's own code wins
    lines = out.getvalue().decode().splitlines()
    assert sum(1 for line in lines if line.startswith("GPU0:line ")) == 3000  # the terminal copy is complete
    warnings = [line for line in lines if "warning: log file" in line]
    assert len(warnings) == 1 and str(log) in warnings[0] and "No space left on device" in warnings[0]


def test_log_folder_that_cannot_be_created_costs_the_log_not_the_job(tmp_path: Path):
    (tmp_path / "logs").write_text("a file where the log folder should be")
    out = io.BytesIO()
    spec = WorkerSpec("GPU0", (PY, "-c", "print('hello')"), prefix="GPU0:", log_path=tmp_path / "logs" / "GPU0.log")
    outcome = run_job([spec], out=out, summary=False)
    assert outcome.exit_code == 0
    text = out.getvalue().decode()
    assert "GPU0:hello" in text and text.count("warning: log file") == 1 and "cannot be opened" in text

"""podguard's lines during a supervised run go to the supervisor's terminal (launch/route.py): a line said by
another thread (the checkpoint mirror, the metrics file writer) comes whole, in order with the workers' lines; a
line said while the loop shuts down, or after, reaches stderr; none is lost and nothing deadlocks."""

from __future__ import annotations

import io
import re
import sys
import threading
import time
from pathlib import Path

from podguard import console
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec
from podguard.launch.supervisor import Supervisor

PY = sys.executable
LONG = "x" * 20_000  # far more than one pipe write of the worker's: the line must still come whole


class _MirrorLike:
    """A Watch that starts a helper thread: it waits for the worker's first line, says a line, then lets the
    worker go on (a file the worker polls for)."""

    def __init__(self, ready: Path, go: Path) -> None:
        self.ready, self.go = ready, go
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self, sup: Supervisor) -> None:
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        while not self.ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        console.say(f"stored checkpoint-1 from a thread {LONG}")
        self.go.touch()

    def close(self) -> None:
        self.thread.join(5)


def test_a_line_said_by_another_thread_comes_whole_between_the_workers_lines(tmp_path: Path, capfd) -> None:
    ready, go = tmp_path / "ready", tmp_path / "go"
    code = (
        "import os, sys, time\n"
        f"print('before', flush=True); open({str(ready)!r}, 'w').close()\n"
        f"deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline: time.sleep(0.01)\n"
        "sys.stdout.write('after'); sys.stdout.flush(); time.sleep(0.2); print(' the half line', flush=True)\n"
    )
    out = io.BytesIO()
    watch = _MirrorLike(ready, go)
    outcome = run_job([WorkerSpec("job", (PY, "-c", code))], grace_s=2, terminal=out, watch=watch)
    assert outcome.exit_code == 0
    lines = out.getvalue().decode().splitlines()
    said = f"podguard: stored checkpoint-1 from a thread {LONG}"
    assert said in lines, lines  # whole: one line, on the terminal
    assert lines.index("before") < lines.index(said) < lines.index("after the half line"), lines
    assert "stored checkpoint-1" not in capfd.readouterr().err  # not on stderr: the terminal took it


def test_no_line_of_a_thread_is_lost_while_the_loop_starts_or_shuts_down(capsys) -> None:
    stop = threading.Event()
    count = [0]

    def chatter() -> None:  # says a line as fast as it can, before, during and after the run
        while not stop.is_set():
            console.say(f"tick {count[0]} {LONG[:200]}")
            count[0] += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=chatter, daemon=True)
    thread.start()
    out = io.BytesIO()
    try:
        for _ in range(3):  # three runs: three shutdowns under the chatter
            job = [WorkerSpec("job", (PY, "-c", "print('working', flush=True)"))]
            assert run_job(job, grace_s=2, terminal=out, summary=False).exit_code == 0
    finally:
        time.sleep(0.05)
        stop.set()
        thread.join(10)
    assert not thread.is_alive(), "the saying thread must never block"
    shown = out.getvalue().decode().splitlines() + capsys.readouterr().err.splitlines()
    ticks = [line for line in shown if "tick" in line]
    assert all(re.fullmatch(rf"podguard: tick \d+ {LONG[:200]}", line) for line in ticks), ticks[:5]  # each whole
    numbers = sorted(int(line.split()[2]) for line in ticks)
    assert numbers == list(range(count[0])), "a line was lost or said twice"
    assert any(line.startswith("podguard: tick") for line in out.getvalue().decode().splitlines())  # the terminal

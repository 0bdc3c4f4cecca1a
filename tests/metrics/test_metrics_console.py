"""podguard's own lines said by its helper threads during a run (here the `--metrics-file` writer's) reach stderr
while stdout is stalled: during the run they go to the supervisor's terminal (launch/route.py), and a warning is
loud, so the stalled-terminal rule (launch/console.py) sends it to stderr too.

A reader that stopped reading stdout (a log collector, a FIFO nobody reads) must not cost the lines that say what
goes wrong: the job prints 2 MB that nobody reads, podguard says stdout is stalled, then the metrics file is
replaced by a FIFO under it, and the writer thread's line about that must still arrive on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from metrics_support import start, wait_for

JOB = "import sys, time; sys.stdout.write(('x' * 99 + '\\n') * 20000); sys.stdout.flush(); time.sleep(120)"


def test_a_helper_threads_line_reaches_stderr_while_stdout_is_stalled(cli_node, tmp_path):
    path = tmp_path / "podguard.prom"
    args = ["run", "--metrics-file", str(path), "--", sys.executable, "-c", JOB]
    proc = start(cli_node, args, PODGUARD_METRICS_INTERVAL="0.05")
    said: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)  # stdout: never read
    reader.start()
    try:
        wait_for(lambda: any("stdout is not being read" in line for line in said), "the stall", 60, proc)
        path.unlink()
        os.mkfifo(path)  # the writer thread meets it at its next write and says so once
        wait_for(lambda: any("it is now a FIFO (named pipe)" in line for line in said), "the writer's line", 30, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.stdout.close()  # type: ignore[union-attr]  (nobody reads it: let podguard's last writes fail fast)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
    line = next(line for line in said if "it is now a FIFO" in line)
    assert line.startswith("podguard: ") and str(path) in line

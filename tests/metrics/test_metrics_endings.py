"""The metrics port closes however the run ends: podguard itself told to stop (SIGTERM, as RunPod's stop does), a
worker killed (SIGKILL), a billing guard (--max-runtime), a hang (79); a scraper that connects and never sends
its request does not hold the end up; and the textfile's last write says the run is over (`podguard_up 0`).

Why: a port left open after the run is a dashboard that shows a dead job as `podguard_up 1` (or a container that
cannot start its next run on the port); a stuck scraper must never keep the supervisor from ending. Each case
runs the real `podguard run` on the fake node with a scraper holding an idle connection open through the end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from metrics_support import free_port, job, port_open, start, try_scrape, wait_for

HANG_JOB = """
import sys, time
from podguard.rank import heartbeat
heartbeat(1)
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize(
    ("how", "code"),
    [("sigterm-podguard", None), ("sigkill-worker", None), ("max-runtime", 124), ("hang", 79)],
)
def test_the_port_closes_however_the_run_ends(cli_node, tmp_path, how, code):
    script, stop = job(tmp_path)
    port, path = free_port(), tmp_path / "podguard.prom"
    args = ["run", "--metrics-port", str(port), "--metrics-file", str(path), "--grace", "5"]
    argv = [sys.executable, script, str(stop)]
    if how == "max-runtime":
        args += ["--max-runtime", "2s"]
    if how == "hang":
        hang = tmp_path / "hang.py"
        hang.write_text(HANG_JOB)
        args += ["--hang-timeout", "2s"]
        argv = [sys.executable, str(hang)]
    proc = start(cli_node, [*args, "--", *argv], PODGUARD_HANG_END_S="3")
    idle = None
    try:
        wait_for(lambda: (f := try_scrape(port)) and "podguard_rank_step" in f, "a heartbeat", proc=proc)
        idle = socket.create_connection(("127.0.0.1", port))  # a scraper that never sends its request
        t0 = time.monotonic()
        if how == "sigterm-podguard":
            proc.send_signal(signal.SIGTERM)
        elif how == "sigkill-worker":
            worker = _worker_pid(proc)
            os.kill(worker, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if idle is not None:
            idle.close()
    if code is not None:
        assert proc.returncode == code, err
    else:
        assert proc.returncode != 0, err
    assert "Traceback" not in err, err
    assert not port_open(port), f"{how}: the port must be closed when the run ends"
    assert took < 15, f"{how}: {took:.1f} s to end"
    assert "podguard_up 0.0" in path.read_text(), f"{how}: the file's last write must say the run is over"


def _worker_pid(proc: subprocess.Popen[str]) -> int:
    """The heartbeat job's pid: the child of podguard that runs beats.py."""
    out = subprocess.run(["pgrep", "-f", "-P", str(proc.pid), "beats.py"], capture_output=True, text=True).stdout
    return int(out.split()[0])

"""`docker restart` with the state dir on a volume, as RunPod restarts a pod's container when its command
exits: a finished job is not run again, a job that crashes at start backs off instead of looping, and a
preflight failure (a broken GPU, exit 76) counts as such a crash."""

from __future__ import annotations

import re
import time

import pytest
from imagetools import docker, fake_gpu_args, logs, state, wait_exited, wait_for

from fakenvml import remap_failure

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# Markers the job prints are computed by the shell (`$((40 + 2))`), so podguard's messages that quote the
# command line never contain them.
BACKOFF_LINE = re.compile(r"(?i)(crash|back.?off|waiting \d)")
# How long a restarted container must stay in its pause without starting the job again (the first pause is
# 10 s; podguard's own start takes well under a second).
PAUSE_OBSERVED_S = 4.0


def _runs(out: str, marker: str) -> int:
    """Lines that start with `marker` (podguard also quotes the job's last lines, indented)."""
    return sum(line.startswith(marker) for line in out.splitlines())


def _restart(cid: str) -> None:
    docker("restart", "-t", "10", cid, check=True)


def _restart_into_pause(cid: str, marker: str, runs: int) -> str:
    """Restart; the container must announce a pause and not start the job again for PAUSE_OBSERVED_S."""
    before = len(BACKOFF_LINE.findall(logs(cid)))
    _restart(cid)
    wait_for(lambda: len(BACKOFF_LINE.findall(logs(cid))) > before, "a line announcing the pause", 30, cid)
    until = time.monotonic() + PAUSE_OBSERVED_S
    while True:
        out = logs(cid)
        assert _runs(out, marker) == runs, f"the job ran again instead of backing off:\n{out[-3000:]}"
        assert state(cid) == "running", f"the container exited instead of backing off:\n{out[-3000:]}"
        if time.monotonic() > until:
            return out
        time.sleep(0.2)


def test_a_finished_job_is_not_run_again(any_container, volume) -> None:
    cid = any_container(
        "train", "--mode", "single", "--", "sh", "-c", "echo JOB-RAN-$((40 + 2))", opts=["-v", f"{volume}:/workspace"]
    )
    assert wait_exited(cid) == 0, logs(cid)
    _restart(cid)
    assert wait_exited(cid) == 0, logs(cid)
    out = logs(cid)
    assert _runs(out, "JOB-RAN-42") == 1, f"the finished job ran again after a restart:\n{out[-3000:]}"
    assert "finished" in out.split("JOB-RAN-42")[-1], out[-2000:]


def test_a_job_that_crashes_at_start_backs_off(any_container, volume) -> None:
    job = ["train", "--mode", "single", "--", "sh", "-c", "echo JOB-CRASHED-$((40 + 2)); exit 3"]
    cid = any_container(*job, opts=["-v", f"{volume}:/workspace"])
    assert wait_exited(cid) == 3, logs(cid)
    _restart(cid)  # the first retry is immediate: a transient failure should not cost time
    assert wait_exited(cid) == 3, logs(cid)
    assert _runs(logs(cid), "JOB-CRASHED-42") == 2
    _restart_into_pause(cid, "JOB-CRASHED-42", 2)
    start = time.monotonic()
    docker("stop", "-t", "10", cid, check=True)
    assert time.monotonic() - start < 5, "SIGTERM did not end the pause"
    assert _runs(logs(cid), "JOB-CRASHED-42") == 2


def test_a_preflight_failure_counts_as_a_crash(container, volume, nvml_node) -> None:
    nvml_node.write(remap_failure(gpu=0))
    opts = [*fake_gpu_args(nvml_node), "-e", "PODGUARD_PROBE=off", "-e", "GPU_LIST=0", "-v", f"{volume}:/workspace"]
    cid = container("train", "--mode", "single", "--", "sh", "-c", "echo JOB-STARTED-$((40 + 2))", opts=opts)
    verdict = "podguard train: UNHEALTHY"
    assert wait_exited(cid) == 76, logs(cid)
    _restart(cid)
    assert wait_exited(cid) == 76, logs(cid)
    out = _restart_into_pause(cid, verdict, 2)
    assert "JOB-STARTED-42" not in out

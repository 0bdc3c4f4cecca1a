"""A hung job always ends (issue 23, item 5): within --hang-timeout + 60 s whatever collecting the evidence does.

py-spy stand-ins that cannot be ended: one blocked in the kernel on a FUSE file that never answers (it outlives
SIGKILL in uninterruptible sleep, as a process stuck in the GPU driver does; needs root and /dev/fuse), and one
that ignores SIGTERM and sleeps. PODGUARD_HANG_END_S=10 shortens the 60 s (a documented test knob): the job
must be over within --hang-timeout + 10 s of its last line, and nothing of it left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fuse_stall import StallFs

from jobproc import PODGUARD, script

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 2
END_S = 10
JOB = """
    import os, pathlib, time
    pathlib.Path(os.environ["PIDFILE"]).write_text(str(os.getpid()))
    print("ready", flush=True)
    time.sleep(3600)
    """


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _with_cmdline(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in entry.joinpath("cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if _running(p)]


def _run_hung_job(
    node,
    tmp_path: Path,
    py_spy: Path,
    *,
    grace_s: float = 1,
    job_text: str = JOB,
    timeout_s: float = 60,
    term_on_hung: bool = False,
) -> tuple[int, str, float, int]:
    """podguard run on a job that prints `ready` and hangs; (exit code, output, seconds from `ready` to the end,
    the job's pid). `term_on_hung`: SIGTERM to podguard as soon as it says HUNG (while it takes the evidence)."""
    job = script(tmp_path, "stuck.py", job_text)
    env = {
        **node.env, "LD_LIBRARY_PATH": "", "PODGUARD_PY_SPY": str(py_spy), "PODGUARD_HANG_END_S": str(END_S),
        "PIDFILE": str(tmp_path / "pid"),
    }  # fmt: skip
    args = ["run", "--hang-timeout", str(HANG_TIMEOUT_S), "--grace", f"{grace_s:g}", "--", sys.executable, job]
    proc = subprocess.Popen(
        [*PODGUARD, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "ready":
                break
        last_line = time.monotonic()
        if term_on_hung:
            for line in proc.stdout:
                lines.append(line)
                if "podguard: HUNG:" in line:
                    proc.send_signal(signal.SIGTERM)
                    break
        out, _ = proc.communicate(timeout=timeout_s)  # the old code waited for py-spy forever (FUSE) or 10 s + more
        ended = time.monotonic() - last_line
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # (a worker SIGKILL cannot end holds the pipe)
            proc.communicate(timeout=5)
    return proc.returncode, "".join(lines) + out, ended, int((tmp_path / "pid").read_text())


def test_a_py_spy_blocked_in_the_kernel_does_not_keep_a_hung_job_running(cli_node, tmp_path):
    if not StallFs.available():
        pytest.skip("needs root and /dev/fuse (a FUSE file that never answers)")
    with StallFs(tmp_path / "mnt") as fs:
        fake = tmp_path / "py-spy"
        fake.write_text(f"#!/bin/sh\nexec cat {fs.file}\n")
        fake.chmod(0o755)
        code, out, ended, pid = _run_hung_job(cli_node, tmp_path, fake)
        assert fs.reads >= 1  # py-spy really blocked in the kernel
    assert code == 79, out[-3000:]
    assert ended < HANG_TIMEOUT_S + END_S, out[-3000:]
    assert "evidence incomplete after" in out and "taking the stacks of 1 process(es) with py-spy" in out
    assert not _running(pid)  # the job is gone
    deadline = time.monotonic() + 5
    while _with_cmdline(str(fs.file)) and time.monotonic() < deadline:  # py-spy goes once the kernel lets it
        time.sleep(0.05)
    assert _with_cmdline(str(fs.file)) == []


def test_a_py_spy_that_ignores_sigterm_does_not_delay_the_end(cli_node, tmp_path):
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!{sys.executable}\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "time.sleep(3600)\n")  # fmt: skip
    fake.chmod(0o755)
    code, out, ended, pid = _run_hung_job(cli_node, tmp_path, fake)
    assert code == 79, out[-3000:]
    assert ended < HANG_TIMEOUT_S + END_S, out[-3000:]  # was: py-spy's own 10 s timeout, then the rest
    assert not _running(pid)
    deadline = time.monotonic() + 5
    while _with_cmdline(str(fake)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _with_cmdline(str(fake)) == [], "the stand-in py-spy was left running"
    assert os.path.exists(fake)


def test_a_long_grace_does_not_keep_a_hung_job_past_the_deadline(cli_node, tmp_path):
    """--grace 30 (time for a save on SIGTERM, which a rank stuck in a collective never runs) and a job that does
    not end on SIGTERM: the grace after a hang is what is left of the 60 s (it was the full 30 s past it)."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    deaf = JOB.replace(
        "import os, pathlib, time",
        "import os, pathlib, signal, time\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    )
    code, out, ended, pid = _run_hung_job(cli_node, tmp_path, fake, grace_s=30, job_text=deaf)
    assert code == 79, out[-3000:]
    assert ended < HANG_TIMEOUT_S + END_S, out[-3000:]  # was 2 + 1 + 30 s
    assert "SIGKILL" in out and not _running(pid)


def test_a_sigterm_while_the_evidence_is_taken_does_not_bring_back_a_long_grace(cli_node, tmp_path):
    """Issue 30, item 8: SIGTERM reaches podguard (a keeper stopping the pod, a user's Ctrl-C) while it takes a
    hung job's evidence, with --grace 120: the hang's deadline still holds (it ended after 130 s)."""
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!{sys.executable}\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "time.sleep(3600)\n")  # fmt: skip
    fake.chmod(0o755)
    deaf = JOB.replace(
        "import os, pathlib, time",
        "import os, pathlib, signal, time\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    )
    code, out, ended, pid = _run_hung_job(
        cli_node, tmp_path, fake, grace_s=120, job_text=deaf, timeout_s=90, term_on_hung=True
    )
    assert code in (79, 143), out[-3000:]
    assert "received SIGTERM" in out
    assert ended < HANG_TIMEOUT_S + END_S, out[-3000:]  # was the full 120 s after the SIGTERM
    assert "SIGKILL" in out and not _running(pid)


def test_a_stalled_state_volume_never_blocks_the_loops_records(tmp_path):
    """The state dir is usually a network volume, and its stall may be what hung the job: the records the loop
    writes (the incomplete evidence at the deadline, watch.json at the end) are waited for briefly, never for
    ever (the loop wrote them itself: the job never ended)."""
    import threading

    from podguard.launch.watch.evidence import HangEvidence
    from podguard.launch.watch.hangs import Hang
    from podguard.launch.watch.runtime import RuntimeSettings, RuntimeWatch

    if not StallFs.available():
        pytest.skip("needs root and /dev/fuse (a FUSE file system that never answers)")
    with StallFs(tmp_path / "mnt", stall_lookups=True) as fs:
        evidence = HangEvidence(Hang(3.0, "none"), fs.mountpoint / "hang", {}, {}, {}, flight=False, job_env={})
        watch = RuntimeWatch(RuntimeSettings(), fs.mountpoint / "run")
        told: list[list[str]] = []
        calls = [lambda: told.append(evidence.unfinished(44.0)), watch.close]
        threads = [threading.Thread(target=call, daemon=True) for call in calls]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, started + 5.0 - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "a record write blocked on the stalled volume"
        assert fs.reads >= 1  # the volume really stalled (the second write waits behind the first lookup)
    assert told and told[0][-1].startswith("evidence incomplete after 44 s")


def test_a_long_grace_never_starves_the_evidence():
    """The 60 s after a hang: the evidence gets 44 s whatever --grace says (it got 1 s from --grace 51 on: the
    stacks were never kept), and the grace of the hung job is what is left, at least 1 s."""
    from podguard.launch.watch.evidence import evidence_deadline_s, hang_grace_s

    assert evidence_deadline_s(60.0, 1.0, grace_s=7.0) == evidence_deadline_s(60.0, 1.0, grace_s=120.0) == 44.0
    assert evidence_deadline_s(60.0, 1.0, grace_s=2.0) == 49.0  # a short grace leaves the evidence more
    assert hang_grace_s(60.0, 1.0, found_at=100.0, now=144.0) == 7.0  # the evidence took all of its 44 s
    assert hang_grace_s(60.0, 1.0, found_at=100.0, now=103.0) == 48.0  # it was quick: the grace may be longer
    assert hang_grace_s(60.0, 1.0, found_at=100.0, now=170.0) == 1.0


def test_a_worker_that_sigkill_cannot_end_does_not_keep_podguard_running(cli_node, tmp_path):
    """The usual GPU hang: the rank itself is in uninterruptible sleep in the driver (here: a read of a FUSE file
    that never answers), so SIGKILL stays pending for ever. podguard gives up on it 2 s after SIGKILL, ends 79 and
    names it (it waited for the worker's exit for ever: the pod billed on)."""
    if not StallFs.available():
        pytest.skip("needs root and /dev/fuse (a FUSE file that never answers)")
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    with StallFs(tmp_path / "mnt") as fs:
        stuck = JOB.replace("time.sleep(3600)", f"open({str(fs.file)!r}, 'rb').read()")
        code, out, ended, pid = _run_hung_job(cli_node, tmp_path, fake, job_text=stuck, timeout_s=30)
        assert fs.reads >= 1
        assert _running(pid)  # (the worker really outlived SIGKILL)
    assert code == 79, out[-3000:]
    assert ended < HANG_TIMEOUT_S + END_S, out[-3000:]
    assert "did not die after SIGKILL" in out and str(pid) in out, out[-3000:]

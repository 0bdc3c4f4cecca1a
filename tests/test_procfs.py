"""podguard.procfs.pid_exists: the one liveness check the store's restore and --prepare's stale lock share."""

from __future__ import annotations

import os
import subprocess
import sys

from podguard.procfs import pid_exists


def test_a_running_process_exists_and_a_reaped_one_does_not() -> None:
    assert pid_exists(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_exists(proc.pid)


def test_another_users_process_exists() -> None:
    assert pid_exists(1)  # PID 1 is there whoever we are (EPERM for a non-root caller means it exists)

"""Whatever podguard starts dies with it, even when podguard is killed with SIGKILL.

    dog = Watchdog.start(job_id, grace_s=7.0)   # one tiny process per job, in its own session
    dog.watch_group(worker.pid)                  # each worker's process group
    dog.close()                                  # the job ended normally: the watchdog exits quietly

The parent-death signal reaches only each worker's first process (`bash` in `bash -c 'python ...'`); the
watchdog holds the read end of a pipe whose write end only podguard has, so podguard's death, however it
happens, is an EOF there, and the watchdog then stops every process of the job (see
`_watchdog_program.py`). docs/supervisor.md.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from podguard.launch.process import JOB_ID_ENV

__all__ = ["Watchdog"]

PROGRAM = Path(__file__).with_name("_watchdog_program.py")
WATCHDOG_NICE = 19  # its ~10 ms of start-up yields to the job; its one sweep takes milliseconds at any nice


class Watchdog:
    """The podguard side of the per-job watchdog. Every method is best-effort: a watchdog that could not
    start leaves the job running with parent-death signals only (and says so once)."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, wfd: int | None) -> None:
        self.proc = proc
        self._wfd = wfd

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @classmethod
    def start(cls, job_id: str, *, grace_s: float) -> Watchdog:
        rfd, wfd = os.pipe()  # both close-on-exec: workers never inherit the write end
        env = {k: v for k, v in os.environ.items() if k != JOB_ID_ENV}  # not a process of any job
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(PROGRAM), job_id, f"{grace_s:g}"],
                stdin=rfd,
                stdout=subprocess.DEVNULL,
                env=env,
                close_fds=True,
                start_new_session=True,  # a signal to podguard's group or session does not reach it
            )
        except OSError as exc:
            os.close(wfd)
            sys.stderr.write(f"podguard: warning: no watchdog for this job ({exc.strerror})\n")
            return cls(None, None)
        finally:
            os.close(rfd)
        with contextlib.suppress(OSError):  # it needs CPU only once podguard is gone: never compete with the job
            os.setpriority(os.PRIO_PROCESS, proc.pid, WATCHDOG_NICE)
        return cls(proc, wfd)

    def _send(self, line: bytes) -> None:
        if self._wfd is None:
            return
        try:
            os.write(self._wfd, line)
        except OSError:  # the watchdog is gone: the job keeps its parent-death signals
            self._close_fd()

    def watch_group(self, pgid: int) -> None:
        """Stop this process group too if podguard dies."""
        self._send(b"g %d\n" % pgid)

    def close(self) -> None:
        """The job is over: tell the watchdog, let it exit, reap it if it already has (never wait)."""
        self._send(b"end\n")
        self._close_fd()
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.poll()

    def _close_fd(self) -> None:
        fd, self._wfd = self._wfd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

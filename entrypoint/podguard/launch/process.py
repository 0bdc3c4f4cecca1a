"""Start one worker: its own output pipe, its own process group, a parent-death signal.

    worker = start_worker(WorkerSpec("GPU0", ("python", "train.py")), job_id="123-456")
    worker.fd            # the read end of its private, non-blocking 1 MiB output pipe
    worker.signal_group(signal.SIGTERM)

The parent-death signal is set by a tiny exec wrapper (`setpriv --pdeathsig`, else a few lines of Python)
rather than `preexec_fn`, which is unsafe once podguard has threads. Why each choice: docs/supervisor.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.launch.spec import WorkerExit, WorkerSpec

JOB_ID_ENV = "PODGUARD_JOB_ID"
PIPE_SIZE = 1 << 20  # 1 MiB: the unprivileged maximum (/proc/sys/fs/pipe-max-size) on stock kernels
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

# The fallback exec wrapper: argv = [signum, expected parent pid, program, args...].
_PY_WRAPPER = (
    "import ctypes,os,sys\n"
    "ctypes.CDLL(None,use_errno=True).prctl(1,int(sys.argv[1]),0,0,0)\n"
    "if os.getppid()!=int(sys.argv[2]):os._exit(128+int(sys.argv[1]))\n"
    "try:os.execvp(sys.argv[3],sys.argv[3:])\n"
    "except OSError as e:\n"
    " sys.stderr.write('podguard: cannot execute %s: %s\\n'%(sys.argv[3],e.strerror));"
    "os._exit(126 if e.errno==13 else 127)\n"
)


@dataclass
class Worker:
    """A started worker. `fd` is the read end of its private output pipe (non-blocking)."""

    spec: WorkerSpec
    popen: subprocess.Popen[bytes]
    fd: int
    started_at: float = field(default_factory=time.monotonic)  # monotonic
    started_wall: float = field(default_factory=time.time)  # epoch seconds, for reports
    status: int | None = None  # waitpid status once reaped
    ended_at: float | None = None  # monotonic, once reaped
    stopped_by_podguard: bool = False  # podguard signalled it (fail-fast / shutdown) before it exited

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.status is None

    def signal_group(self, signum: int) -> bool:
        """Send `signum` to the worker's whole process group; False when the group is already gone."""
        try:
            os.killpg(self.pid, signum)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:  # a member changed uid; try the leader at least
            try:
                os.kill(self.pid, signum)
                return True
            except OSError:
                return False

    def exit_record(self, tail: tuple[str, ...] = (), first_error: tuple[str, ...] = ()) -> WorkerExit:
        """How it ended (so far: None fields while it runs), with its last output lines and first traceback."""
        code = os.waitstatus_to_exitcode(self.status) if self.status is not None else None
        ended = self.ended_at if self.ended_at is not None else time.monotonic()
        return WorkerExit(
            name=self.name,
            pid=self.pid,
            returncode=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            tail=tail,
            stopped_by_podguard=self.stopped_by_podguard,
            duration_s=round(ended - self.started_at, 3),
            first_error=first_error,
        )

    def mark_reaped(self, status: int) -> None:
        """Record the wait status that the supervisor collected with waitpid (it owns reaping)."""
        self.status = status
        self.ended_at = time.monotonic()
        # Popen must not wait for a pid that is already reaped (and possibly reused).
        self.popen.returncode = os.waitstatus_to_exitcode(status)


@functools.cache
def _setpriv() -> str | None:
    """Absolute path of a `setpriv` that understands --pdeathsig (util-linux >= 2.33), or None."""
    path = shutil.which("setpriv")
    if not path:
        return None
    try:
        probe = subprocess.run(
            [path, "--pdeathsig", "TERM", "--", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path if probe.returncode == 0 else None


def pdeathsig_wrapper(signum: int) -> list[str]:
    """The argv prefix that gives the exec'd command a parent-death signal `signum`."""
    setpriv = _setpriv()
    if setpriv:
        return [setpriv, "--pdeathsig", signal.Signals(signum).name.removeprefix("SIG"), "--"]
    return [sys.executable, "-I", "-S", "-c", _PY_WRAPPER, str(signum), str(os.getpid())]


def child_env(spec: WorkerSpec) -> dict[str, str]:
    env = dict(os.environ) if spec.inherit_env else {}
    env.update(spec.env)
    return env


def resolve_program(spec: WorkerSpec, env: dict[str, str]) -> str:
    """The absolute (or cwd-relative) program path for argv[0]; UsageError when it cannot run."""
    if not spec.argv:
        raise UsageError(f"{spec.name}: empty command; give the program to run after '--'")
    if spec.cwd is not None and not Path(spec.cwd).is_dir():
        raise UsageError(f"{spec.name}: working directory {str(spec.cwd)!r} does not exist")
    program = spec.argv[0]
    if "/" in program:
        path = Path(program) if spec.cwd is None or Path(program).is_absolute() else Path(spec.cwd) / program
        if not path.exists():
            raise UsageError(f"{spec.name}: command {program!r} does not exist")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise UsageError(
                f"{spec.name}: {program!r} is not an executable file "
                "(chmod +x it, or run it through its interpreter, e.g. 'python x.py')"
            )
        return program
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if not found:
        raise UsageError(f"{spec.name}: command {program!r} not found on PATH")
    return found


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()  # both close-on-exec; Popen dup2()s the write end onto 1 and 2
    # EPERM over the per-user pipe quota, or an old kernel: the default 64 KiB works too
    with contextlib.suppress(OSError):
        fcntl.fcntl(r, _F_SETPIPE_SZ, PIPE_SIZE)
    os.set_blocking(r, False)
    return r, w


def start_worker(spec: WorkerSpec, *, pdeathsig: int | None = signal.SIGTERM, job_id: str | None = None) -> Worker:
    """Start `spec` in its own process group with its own output pipe (docs/supervisor.md).

    `pdeathsig=None` starts the command directly (no wrapper) — for callers that manage lifetime
    some other way. `job_id` is put in the environment as `PODGUARD_JOB_ID`, which every descendant
    inherits: the supervisor uses it to tell the job's orphans from other processes when it is PID 1.
    Raises `UsageError` when the program does not exist or cannot be executed.
    """
    env = child_env(spec)
    if job_id is not None:
        env[JOB_ID_ENV] = job_id
    program = resolve_program(spec, env)
    argv = [program, *spec.argv[1:]]
    if pdeathsig:
        argv = pdeathsig_wrapper(pdeathsig) + argv
    r, w = _pipe()
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=w,
            stderr=w,
            env=env,
            cwd=spec.cwd,
            close_fds=True,
            process_group=0,
            bufsize=0,
        )
    except OSError as exc:
        os.close(r)
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC):
            raise UsageError(f"{spec.name}: cannot execute {spec.argv[0]!r}: {exc.strerror}") from None
        raise PodguardError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc.strerror}", ExitCode.FAILURE) from None
    finally:
        os.close(w)
    return Worker(spec=spec, popen=popen, fd=r)

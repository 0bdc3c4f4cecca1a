"""Exit codes, the one exception type that carries them to the command line, and signal conventions.

Every user-facing failure is a `PodguardError` with a one-line message and a documented exit code
(docs/reference.md, "Exit codes"); the CLI prints the message and exits with the code, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1  # a generic failure: a service that exited 0 before the job was done, torchrun's own 1
    USAGE = 64  # bad input or configuration
    NO_SUCH_POD = 66  # pod commands: no pod with that name or id
    GPUS_MISSING = 69  # the GPUs that were required are not there
    GPUS_BUSY = 75  # still busy when the wait deadline passed (a retry may succeed)
    GPU_UNHEALTHY = 76  # hardware or driver problem: needs a pod restart or another machine
    HUNG = 79  # no progress for --hang-timeout: the job was hung (evidence under the state dir)
    API_ACCESS = 77  # pod commands: API key missing or rejected, or the account may not do this (402/403)
    READY_TIMEOUT = 124  # roles: a role was not ready in time (coreutils `timeout`'s code)
    BILLING_GUARD = 124  # a billing guard (--idle-stop, --max-runtime, --max-cost) ended the job, outside a pod
    CANNOT_EXECUTE = 126  # the shell's code for "found but cannot be executed"
    NOT_FOUND = 127  # the shell's code for "command not found"
    SIGNAL_BASE = 128  # 128+N: ended by signal N


class PodguardError(Exception):
    """A failure the user must see as one clear line, with the exit code it maps to."""

    def __init__(self, message: str, code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = int(code)
        self.end_said = False  # train/run: the run's END line already names this failure


class UsageError(PodguardError):
    """Bad input: names the bad value and what would be valid. Exit 64."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


# Between SIGTERM and SIGKILL whenever podguard stops processes (cleanup, fail-fast, shutdown): it fits inside
# Docker's default 10 s stop timeout with room for podguard's own exit (docs/supervisor.md).
DEFAULT_GRACE_S = 7.0


def signal_exit_code(signum: int) -> int:
    """The shell convention for a process ended by a signal."""
    return ExitCode.SIGNAL_BASE + signum

"""Exit codes and the one exception type that carries them to the command line.

Every user-facing failure is a `PodguardError` with a one-line message and a documented exit code
(see PRODUCT.md); the CLI prints the message and exits with the code, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 64  # bad input or configuration
    GPUS_MISSING = 69  # the GPUs that were required are not there
    GPUS_BUSY = 75  # still busy when the wait deadline passed (a retry may succeed)
    GPU_UNHEALTHY = 76  # hardware or driver problem: needs a pod restart or another machine
    SIGNAL_BASE = 128  # 128+N: ended by signal N


class PodguardError(Exception):
    """A failure the user must see as one clear line, with the exit code it maps to."""

    def __init__(self, message: str, code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = int(code)


class UsageError(PodguardError):
    """Bad input: names the bad value and what would be valid. Exit 64."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


def signal_exit_code(signum: int) -> int:
    """The shell convention for a process ended by a signal."""
    return ExitCode.SIGNAL_BASE + signum

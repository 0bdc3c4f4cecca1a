"""Start a program that dies with its parent, without `preexec_fn`: a tiny exec wrapper sets the death signal.

    argv = dying_with(os.getpid(), ["my-probe", "--gpu", "0"])
    subprocess.Popen(argv, start_new_session=True)   # no preexec_fn: safe while other threads run

`preexec_fn` runs Python code between fork and exec, which is unsafe once the process has threads (the
XID watcher): a lock held by another thread at fork time stays held in the child forever. The wrapper is
`python -I -S -c ...` that calls prctl(PR_SET_PDEATHSIG, SIGKILL), checks the parent is still the one
that started it (it may have died before the signal was armed), then execs the real program; the death
signal survives execve.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["WRAPPER", "dying_with"]

WRAPPER = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(128 + signal.SIGKILL)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc:\n"
    "    print(f'cannot run {sys.argv[2]!r}: {exc.strerror}', file=sys.stderr)\n"
    "    os._exit(127)\n"
)


def dying_with(parent: int, argv: Sequence[str]) -> list[str]:
    """`argv` wrapped so that the started program gets SIGKILL when `parent` dies."""
    return [sys.executable, "-I", "-S", "-c", WRAPPER, str(parent), *argv]

"""Real kernel stand-ins for what a pod sees, for the lifecycle tests (owner: lifecycle helper).

* `in_container(argv, ...)`: run `argv` as the entry process (PID 1) of a fresh container instance: new
  PID, mount and UTS namespaces (`unshare`), optionally its own hostname and a small tmpfs at some path
  (a volume that really fills up: ENOSPC). Give each pod its own TMPDIR for host-local files.
* `nolock_env(path)`: an LD_PRELOAD shim (built with gcc) under which the `flock()` call fails with
  ENOLCK for files below `path`, as it does on an NFS volume without a lock daemon.

Tests call `require_namespaces()` first; it skips with the reason where `unshare` is not permitted.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parent.parent

_SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int below_nolock_dir(int fd) {
    const char *root = getenv("NOLOCK_DIR");
    char link[64], path[PATH_MAX];
    if (!root || !*root) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    size_t len = strlen(root);
    return strncmp(path, root, len) == 0 && (path[len] == '/' || path[len] == 0);
}

int flock(int fd, int op) {
    static int (*real)(int, int);
    if (!real) real = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    if (below_nolock_dir(fd)) { errno = ENOLCK; return -1; }
    return real(fd, op);
}
"""


@functools.cache
def namespaces_problem() -> str | None:
    """None when `unshare` can make PID/mount/UTS namespaces and mount a tmpfs here; else why not."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c",
         "mount -t tmpfs -o size=64k tmpfs /mnt && hostname probe && test $$ = 1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return None if probe.returncode == 0 else f"namespaces/tmpfs not permitted here: {probe.stderr.strip()[:200]}"


def require_namespaces() -> None:
    problem = namespaces_problem()
    if problem is not None:
        pytest.skip(problem)


def in_container(
    argv: Sequence[str],
    *,
    hostname: str | None = None,
    tmpfs: Path | None = None,
    tmpfs_size: str = "1m",
) -> list[str]:
    """The argv that runs `argv` as PID 1 of a new container instance (see the module docstring)."""
    setup = []
    if tmpfs is not None:
        setup.append(f"mount -t tmpfs -o size={tmpfs_size},mode=0755 tmpfs {shlex.quote(str(tmpfs))}")
    if hostname is not None:
        setup.append(f"hostname {shlex.quote(hostname)}")
    script = " && ".join([*setup, 'exec "$@"'])
    return ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c", script, "sh", *argv]


@functools.cache
def _shim(build_dir: str) -> Path:
    out = Path(build_dir) / "libnolock.so"
    src = Path(build_dir) / "nolock.c"
    if not (out.exists() and src.exists() and src.read_text() == _SHIM_C):
        Path(build_dir).mkdir(parents=True, exist_ok=True)
        src.write_text(_SHIM_C)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"], check=True, timeout=60)
    return out


def nolock_env(path: Path, build_dir: Path | None = None) -> dict[str, str]:
    """Env entries that make flock() fail with ENOLCK below `path` in the processes that get them."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the ENOLCK shim")
    where = build_dir if build_dir is not None else _REPO / "build" / "nolock"
    preload = " ".join(p for p in (str(_shim(str(where))), os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, "NOLOCK_DIR": os.path.realpath(path)}

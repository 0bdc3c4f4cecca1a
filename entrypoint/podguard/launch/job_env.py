"""The environment every launched job gets unless the user's own sets it: line-buffered C stdio (coreutils'
`libstdbuf`, and for perl and C++'s own buffers the shims of line_shims.py), rich's live displays drawn on
podguard's pipe, unbuffered Python, a fair OMP_NUM_THREADS.

    env = job_env(workers=2)

The reasoning (a pty weighed against stdbuf, rich's switches) is in docs/supervisor.md. Standard library only:
the mode builders and the torchrun command both read it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from podguard.launch.line_shims import shim_env

__all__ = ["LINE_BUFFERING_ENV", "job_env", "line_buffering_env", "progress_bar_env"]

# coreutils' stdbuf preload library (the path `stdbuf` itself was built with differs between distributions)
_STDBUF_LIBS = (
    "/usr/libexec/coreutils/libstdbuf.so",  # Debian 12 (checked here), Ubuntu, Fedora/RHEL
    "/usr/lib/coreutils/libstdbuf.so",  # Arch
    "/usr/lib/x86_64-linux-gnu/coreutils/libstdbuf.so",  # the older Debian/Ubuntu multiarch layout
    "/usr/lib/aarch64-linux-gnu/coreutils/libstdbuf.so",
    "/usr/lib64/coreutils/libstdbuf.so",  # a lib64 libexecdir (older RPM-based layouts)
    "/usr/local/libexec/coreutils/libstdbuf.so",
)
LINE_BUFFERING_ENV = "PODGUARD_LINE_BUFFERING"  # "0": leave the job's C stdio buffering alone


@functools.cache
def _stdbuf_lib() -> str | None:
    return next((path for path in _STDBUF_LIBS if os.path.isfile(path)), None)


def line_buffering_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`stdbuf -oL` for every process of the job: coreutils' preload library with `_STDBUF_O=L`, so a C/C++
    program's stdout on podguard's pipe is line-buffered (block-buffered by default: nothing for 4 KiB, and lost
    at a kill). Nothing where the user set `_STDBUF_O` or `PODGUARD_LINE_BUFFERING=0`, or the library is missing;
    the user's own LD_PRELOAD comes first. Why not a pty: docs/supervisor.md."""
    env = os.environ if environ is None else environ
    lib = _stdbuf_lib()
    preload = env.get("LD_PRELOAD", "")
    if lib is None or "_STDBUF_O" in env or env.get(LINE_BUFFERING_ENV) == "0" or "libstdbuf" in preload:
        return {}
    # a dynamically linked AddressSanitizer build refuses to start unless its runtime is preloaded first
    asan = env.get("ASAN_OPTIONS", "")
    if "verify_asan_link_order" not in asan:
        asan = f"{asan}:verify_asan_link_order=0" if asan else "verify_asan_link_order=0"
    ld_preload = f"{preload}:{lib}" if preload.strip() else lib
    out = {"LD_PRELOAD": ld_preload, "_STDBUF_O": "L", "ASAN_OPTIONS": asan}
    out.update(shim_env(env, ld_preload))  # perl's autoflush, the C++ sync_with_stdio shim (line_shims.py)
    return out


def progress_bar_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """rich's switches (TTY_COMPATIBLE, TTY_INTERACTIVE) so that its live displays draw on podguard's pipe: on a
    pipe rich draws nothing until the end (Lightning's default bar wherever rich is installed: a healthy job looked
    hung). podguard renders what they draw (`\\r` ends a line, cursor moves dropped). Left alone where the user set
    either."""
    env = os.environ if environ is None else environ
    if "TTY_COMPATIBLE" in env or "TTY_INTERACTIVE" in env:
        return {}
    return {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}


def job_env(workers: int) -> dict[str, str]:
    """Defaults every launched job gets unless the user's environment sets them (docs/supervisor.md)."""
    env: dict[str, str] = {**line_buffering_env(), **progress_bar_env()}
    if "PYTHONUNBUFFERED" not in os.environ:
        env["PYTHONUNBUFFERED"] = "1"
    if "OMP_NUM_THREADS" not in os.environ and workers > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    return env

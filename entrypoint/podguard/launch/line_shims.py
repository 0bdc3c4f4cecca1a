"""Line by line from programs that keep their own output buffers, where coreutils' stdbuf cannot reach them.

    env = shim_env(environ)        # PERL5OPT/PERL5LIB (perl's autoflush), the C++ shim's path for LD_PRELOAD
    buffering_warnings(argv)       # a C++ program podguard could not keep line by line: one warning line each

* **perl** buffers in PerlIO, not in C stdio: `| perl -pe 's/^/[train] /'` held the job's lines in 8 KiB blocks on
  podguard's pipe (on a terminal it prints line by line). podguard puts a four-line module on PERL5LIB and loads it
  with PERL5OPT (`-MPodguardAutoflush`): it turns on `$|` (autoflush) for STDOUT where STDOUT is a pipe or a socket,
  nowhere else. perl ignores both variables in taint mode (-T), as perlrun says.
* **C++ with `std::ios_base::sync_with_stdio(false)`**: libstdc++ then gives `std::cout` its own 8 KiB buffer
  (`stdio_filebuf`, BUFSIZ), which no setvbuf reaches and which is flushed only by `std::endl`, `std::flush` or a
  full buffer, even on a terminal. A tiny preloaded library answers the call for `false` with "still in sync" where
  stdout is a pipe (the stream then writes through C stdio, which stdbuf line-buffers), and passes any other call
  to libstdc++. It is compiled here once per machine with the C compiler the job's image has (`cc`; torch.compile
  needs one too), cached in a private folder (`~/.cache/podguard/native`, 0700, owned by this user), and loaded
  once to check it works where it lies (a `noexec` mount would make every exec of the job print a loader warning).
  Without a compiler: nothing is preloaded, and a job whose command is such a program gets one warning at start.
* **mawk** (Debian's awk) reads its input in blocks and prints its records only when a block is full, whatever
  its stdout: nothing from outside makes it line by line (`mawk -W interactive` does). The run-time watch counts
  the bytes such a filter reads as the job's activity instead (launch/watch/filters.py).

`PODGUARD_LINE_BUFFERING=0` turns all of this off, with stdbuf (job_env.py). docs/watch.md, "Filters and buffers".
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["CXX_SYNC_SYMBOL", "PERL_MODULE", "buffering_warnings", "cxx_shim", "perl_dir", "shim_env"]

PERL_MODULE = "PodguardAutoflush"
PERL_SOURCE = """package PodguardAutoflush;
# podguard: perl's own buffering ignores stdbuf; line by line where STDOUT is a pipe (PODGUARD_LINE_BUFFERING=0: off)
$| = 1 if -p STDOUT || -S STDOUT;
1;
"""
CXX_SYNC_SYMBOL = "_ZNSt8ios_base15sync_with_stdioEb"  # std::ios_base::sync_with_stdio(bool)
SHIM_SOURCE = f"""#define _GNU_SOURCE
/* podguard: std::ios_base::sync_with_stdio(false) where stdout is a pipe leaves std::cout in sync with C stdio,
   which stdbuf makes line-buffered; any other call goes to libstdc++. */
#include <dlfcn.h>
#include <stdbool.h>
#include <sys/stat.h>
typedef bool (*sync_fn)(bool);
bool {CXX_SYNC_SYMBOL}(bool sync) {{
    struct stat st;
    if (!sync && fstat(1, &st) == 0 && S_ISFIFO(st.st_mode)) return true;
    sync_fn real = (sync_fn)dlsym(RTLD_NEXT, "{CXX_SYNC_SYMBOL}");
    return real ? real(sync) : true;
}}
"""
COMPILE_TIMEOUT_S = 60.0


def _private_dir(path: Path) -> Path | None:
    """`path` made (0700) and checked: a real folder, this user's, writable by nobody else; None otherwise."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path


@functools.cache
def _cache_dir() -> Path | None:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for place in (Path(base) / "podguard" / "native", Path(tempfile.gettempdir()) / f"podguard-{os.getuid()}"):
        if (found := _private_dir(place)) is not None:
            return found
    return None


def _mine(path: Path) -> bool:
    """A regular file of this user's that nobody else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@functools.cache
def perl_dir() -> Path | None:
    """The folder holding PodguardAutoflush.pm (written if missing or changed); None where none can be had."""
    folder = _cache_dir()
    if folder is None or (folder := _private_dir(folder / "perl")) is None:
        return None
    module = folder / f"{PERL_MODULE}.pm"
    try:
        if not _mine(module) or module.read_text() != PERL_SOURCE:
            _write_atomic(module, PERL_SOURCE.encode())
    except OSError:
        return None
    return folder


@functools.cache
def cxx_shim() -> Path | None:
    """The compiled shim (built once per machine and source), or None where no C compiler can build it."""
    folder = _cache_dir()
    if folder is None:
        return None
    tag = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:12]
    lib = folder / f"libpodguard_linebuf-{tag}-{platform.machine()}.so"
    if _mine(lib):
        return lib
    cc = next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)
    if cc is None:
        return None
    src = folder / f".linebuf-{os.getpid()}.c"
    out = folder / f".{lib.name}.{os.getpid()}"
    try:
        src.write_text(SHIM_SOURCE)
        built = subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"],
            capture_output=True, timeout=COMPILE_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        if built.returncode != 0 or not _loads(out):
            return None
        os.replace(out, lib)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        for leftover in (src, out):
            leftover.unlink(missing_ok=True)
    return lib


def _loads(lib: Path) -> bool:
    """The loader maps it without a word (a noexec mount would warn at every exec of the job)."""
    true = shutil.which("true")
    if true is None:
        return False
    try:
        proc = subprocess.run(
            [true], env={**os.environ, "LD_PRELOAD": str(lib)}, capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and not proc.stderr


def shim_env(environ: Mapping[str, str], preload: str) -> dict[str, str]:
    """What a job gets on top of stdbuf (`preload`: the LD_PRELOAD stdbuf built): the C++ shim after libstdbuf,
    perl's autoflush module. Nothing the user already set is replaced: their PERL5OPT and PERL5LIB come first."""
    env: dict[str, str] = {}
    if (lib := cxx_shim()) is not None:
        env["LD_PRELOAD"] = f"{preload}:{lib}"
    opt = environ.get("PERL5OPT", "")
    if PERL_MODULE not in opt and (folder := perl_dir()) is not None:
        env["PERL5OPT"] = f"{opt} -M{PERL_MODULE}".strip()
        user_lib = environ.get("PERL5LIB", "")
        env["PERL5LIB"] = f"{user_lib}:{folder}" if user_lib else str(folder)
    return env


def buffering_warnings(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for a job whose program podguard cannot keep line by line: a C++ program that calls
    sync_with_stdio where the shim is not preloaded (no C compiler, or PODGUARD_LINE_BUFFERING=0)."""
    env = os.environ if environ is None else environ
    if not argv or "libpodguard_linebuf" in env.get("LD_PRELOAD", ""):
        return []
    program = shutil.which(argv[0], path=env.get("PATH")) or argv[0]
    try:
        with open(program, "rb") as fh:
            calls = fh.read(4) == b"\x7fELF" and CXX_SYNC_SYMBOL.encode() in fh.read(64 << 20)
    except OSError:
        return []
    if not calls:
        return []
    why = "PODGUARD_LINE_BUFFERING=0" if env.get("PODGUARD_LINE_BUFFERING") == "0" else "no C compiler was found"
    return [
        f"{os.path.basename(program)} calls std::ios_base::sync_with_stdio: after sync_with_stdio(false) its "
        f"std::cout reaches podguard only in 8 KiB blocks (std::endl or std::flush send a line at once) and {why} "
        "to keep it line by line; give it --progress with heartbeats, or flush its lines"
    ]

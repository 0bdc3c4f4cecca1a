"""torch's NCCL flight recorder: armed at launch for runs with a hang timeout, dumped through its pipe on a hang.

    env.update(flight_recorder_env(state_dir / "flight", os.environ, torch_version=installed_torch_version()))
    ...
    files = trigger_flight_dump(state_dir / "flight", environ=job_env)   # on a hang, before ending the tree

What torch reads (torch 2.3 to 2.13; sources, versions and what a real H100 showed: docs/watch.md, "Flight
recorder"):
- the ring buffer: `TORCH_FR_BUFFER_SIZE`, older `TORCH_NCCL_TRACE_BUFFER_SIZE` (torch 2.3/2.4 know only the
  older name, and its default there is 0: off);
- a dump when the NCCL watchdog times out: `TORCH_NCCL_DUMP_ON_TIMEOUT` (no TORCH_FR_ name up to 2.13); it also
  makes the monitor thread check the pipe every second (`TORCH_NCCL_COORD_CHECK_MILSEC`);
- the monitor thread that reads the pipe: `TORCH_NCCL_ENABLE_MONITORING` (on by default);
- the dump file prefix: `TORCH_FR_DUMP_TEMP_FILE`, older `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`: rank N writes
  `<prefix>N`;
- the pipe prefix: `TORCH_NCCL_DEBUG_INFO_PIPE_FILE` (`TORCH_FR_DEBUG_INFO_PIPE_FILE` for the backends that
  read that name): rank N's default process group makes the FIFO `<prefix>N.pipe` and dumps when something
  is written to it. podguard's: `<dump_dir>/pipes/rank_N.pipe`, next to the dumps `<dump_dir>/nccl_trace_rank_N`.
Both names are set unless the job's torch is known to be >= 2.11, which reads the newer names and warns once
per rank about each older one. A setting the user gave under either of its names is left alone under both;
a user who turned the buffer off (0) gets nothing armed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUFFER_ENTRIES",
    "DUMP_BASENAME",
    "SETTINGS",
    "flight_recorder_env",
    "installed_torch_version",
    "trigger_flight_dump",
]

BUFFER_ENTRIES = 2000  # torch's own default since 2.5; 2.3/2.4 default to 0 (off)
DUMP_BASENAME = "nccl_trace_rank_"  # torch's own default basename; the rank number follows
# The FIFOs live in a subfolder and never contain DUMP_BASENAME: torch's analyzer (`torchfrtrace DIR`) reads every
# file under DIR whose name holds the dump prefix, and opening a FIFO that nobody writes blocks it forever.
PIPE_SUBDIR, PIPE_BASENAME = "pipes", "rank_"
DUMP_WAIT_S = 15.0  # torch 2.11 on an H100 took 6-8 s from the pipe write to a complete file (it symbolizes)
POLL_S = 0.05
STABLE_S = 0.2  # a dump file whose size has not changed for this long is complete


NEW_NAMES_FROM = (2, 11)  # seen on a real H100: torch 2.11 arms, pipes and dumps with the newer names alone


@dataclass(frozen=True)
class Setting:
    """One thing torch reads, under each of its names in torch's order of precedence; `legacy`: the names
    only an older torch needs (a torch >= NEW_NAMES_FROM warns that they are deprecated)."""

    names: tuple[str, ...]
    what: str
    legacy: tuple[str, ...] = ()


BUFFER = Setting(
    ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), "buffer entries", ("TORCH_NCCL_TRACE_BUFFER_SIZE",)
)
DUMP_ON_TIMEOUT = Setting(("TORCH_NCCL_DUMP_ON_TIMEOUT",), "dump when the watchdog times out")
MONITORING = Setting(("TORCH_NCCL_ENABLE_MONITORING",), "the monitor thread that reads the pipe")
DUMP_FILE = Setting(
    ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    "dump file prefix",
    ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",),
)
PIPE = Setting(("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE"), "pipe prefix")
SETTINGS = (BUFFER, DUMP_ON_TIMEOUT, MONITORING, DUMP_FILE, PIPE)


def _user_value(setting: Setting, environ: Mapping[str, str]) -> str | None:
    """The user's value under the name torch gives precedence to among those they set, else None."""
    return next((environ[n] for n in setting.names if n in environ), None)


def _version(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed_torch_version(python: str | None = None) -> str | None:
    """The torch version `python` (default: this one) would import, read from its metadata without importing
    torch; None when there is no torch or it cannot be told."""
    if python is None or python == sys.executable:
        import importlib.metadata  # noqa: PLC0415  lazy: ~20 ms (email, csv, zipfile) only --hang-timeout needs

        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return None
    code = "import importlib.metadata as m; print(m.version('torch'))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _buffer_off(environ: Mapping[str, str]) -> bool:
    value = _user_value(BUFFER, environ)
    try:
        return value is not None and int(value.strip() or "0") <= 0
    except ValueError:
        return False


def _fifo_ok(directory: Path) -> bool:
    """Whether torch's mkfifo will work there: a failing mkfifo inside torch would fail the user's
    init_process_group, so a folder without FIFOs (some network file systems) gets no pipe."""
    probe = directory / f".podguard-fifo-probe-{os.getpid()}"
    try:
        directory.mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()
        os.mkfifo(probe, 0o600)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.unlink()
    return True


def flight_recorder_env(
    dump_dir: Path, environ: Mapping[str, str], *, torch_version: str | None = None
) -> dict[str, str]:
    """The variables to add to the workers' environment so that torch's flight recorder records, dumps on
    its own timeout, and dumps on request through a pipe, all under `dump_dir` (created here). {} when the
    user turned the recorder off or `dump_dir` cannot be made. `torch_version`: the job's torch, where known
    (`installed_torch_version`): from 2.11 on, only the names it does not call deprecated."""
    if _buffer_off(environ):
        return {}
    try:
        dump_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    prefix = str(dump_dir.resolve() / DUMP_BASENAME)
    values = {BUFFER: str(BUFFER_ENTRIES), DUMP_ON_TIMEOUT: "1", MONITORING: "1", DUMP_FILE: prefix}
    if _fifo_ok(dump_dir / PIPE_SUBDIR):
        values[PIPE] = str(dump_dir.resolve() / PIPE_SUBDIR / PIPE_BASENAME)
    modern = (_version(torch_version) or (0, 0)) >= NEW_NAMES_FROM
    env: dict[str, str] = {}
    for setting, value in values.items():
        if _user_value(setting, environ) is None:
            env.update({n: value for n in setting.names if not (modern and n in setting.legacy)})
    return env


def _prefix(setting: Setting, dump_dir: Path, environ: Mapping[str, str] | None) -> str:
    """The prefix in effect: the job's own (the user's, or the one podguard armed), else podguard's default."""
    user = _user_value(setting, environ or {})
    if user:
        return user
    return str(dump_dir / PIPE_SUBDIR / PIPE_BASENAME) if setting is PIPE else str(dump_dir / DUMP_BASENAME)


def _pipes(pipe_prefix: str) -> dict[int, Path]:
    """rank -> its FIFO `<prefix><rank>.pipe` (regular files of that name are not pipes: left alone)."""
    folder, base = os.path.split(pipe_prefix)
    pattern = re.compile(re.escape(base) + r"(\d+)\.pipe$")
    found: dict[int, Path] = {}
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return found
    for entry in entries:
        match = pattern.match(entry)
        path = Path(folder or ".") / entry
        with contextlib.suppress(OSError):
            if match and stat.S_ISFIFO(path.lstat().st_mode):
                found[int(match.group(1))] = path
    return found


def _poke(pipe: Path) -> bool:
    """Write to one rank's pipe without ever blocking: False when no process reads it (the rank is gone)."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # ENXIO: no reader; ENOENT: removed meanwhile
        return False
    try:
        os.write(fd, b"dump\n")
    except OSError as exc:
        return exc.errno == errno.EAGAIN  # a full pipe already holds an unread request
    finally:
        os.close(fd)
    return True


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _wait(files: dict[int, Path], before: dict[int, tuple[int, int] | None], deadline: float) -> None:
    """Until every rank's dump file was (re)written after the request and stayed the same size for STABLE_S."""
    pending = dict(files)
    seen: dict[int, tuple[tuple[int, int], float]] = {}
    while pending and time.monotonic() < deadline:
        now = time.monotonic()
        for rank, path in list(pending.items()):
            sig = _signature(path)
            if sig is None or sig == before[rank] or sig[1] == 0:
                continue
            last = seen.get(rank)
            if last is None or last[0] != sig:
                seen[rank] = (sig, now)
            elif now - last[1] >= STABLE_S:
                del pending[rank]
        time.sleep(POLL_S)


def trigger_flight_dump(
    dump_dir: Path, *, timeout_s: float = DUMP_WAIT_S, environ: Mapping[str, str] | None = None
) -> list[Path]:
    """Ask every live rank for a flight-recorder dump through its pipe, wait (at most `timeout_s`) for the
    files, and return every non-empty dump file there (also ones torch wrote on its own timeout), by rank.
    Never blocks on a pipe nobody reads. `environ`: the job's, where the user chose their own prefixes."""
    dump_prefix = _prefix(DUMP_FILE, dump_dir, environ)
    pipes = _pipes(_prefix(PIPE, dump_dir, environ))
    files = {rank: Path(f"{dump_prefix}{rank}") for rank in pipes}
    before = {rank: _signature(path) for rank, path in files.items()}
    poked = {rank: files[rank] for rank, pipe in sorted(pipes.items()) if _poke(pipe)}
    _wait(poked, before, time.monotonic() + timeout_s)
    return _dumps(dump_prefix)


def _dumps(dump_prefix: str) -> list[Path]:
    folder, base = os.path.split(dump_prefix)
    pattern = re.compile(re.escape(base) + r"(\d+)$")
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder or "."):
            match = pattern.match(entry)
            path = Path(folder or ".") / entry
            if match and (sig := _signature(path)) is not None and sig[1] > 0 and path.is_file():
                found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]

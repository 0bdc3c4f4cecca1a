"""Prepare once: run a data/tokenizer preparation step once per cache key, never twice, never half.

    result = prepare_once(["python", "prep.py"], cache_root=state / "prepare", key_parts={"dataset": "gsm8k"})
    result.path  # <cache_root>/<key>/, complete (its stamp says so); the command wrote it via $PODGUARD_PREPARE_DIR

The step runs in a host-unique temp folder that gets its stamp and is then renamed into place: the rename
is the commit, so a result is whole or absent, also between pods sharing a network volume. Why each
piece is there (locks on NFS, stale temps, multi-node): docs/lifecycle.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError, signal_exit_code
from podguard.launch.prepare_stale import TMP_PREFIX, clean_stale
from podguard.redact import redact_command, redact_env
from podguard.state import NoFlock, host_id, local_lock_dir, open_lock, try_flock, unique_suffix, write_private

__all__ = [
    "ENV_PREPARE_DIR",
    "ENV_PREPARE_KEY",
    "STAMP_NAME",
    "PrepareError",
    "PrepareResult",
    "PreparedBy",
    "cache_key",
    "prepare_once",
]

ENV_PREPARE_DIR = "PODGUARD_PREPARE_DIR"
ENV_PREPARE_KEY = "PODGUARD_PREPARE_KEY"
STAMP_NAME = ".podguard-prepared.json"
_KEY_VERSION = 1  # bump when the key's recipe changes, so old caches are not mistaken for new ones

Command = Sequence[str] | Callable[[Path], Any]


class PreparedBy(StrEnum):
    THIS_PROCESS = "this process"
    ANOTHER_PROCESS = "another process"  # on this host: we waited for its lock
    ANOTHER_HOST = "another host"  # a pod on the same volume published it first
    CACHE = "cache"
    NODE0 = "node 0"


class PrepareError(PodguardError):
    """The prepare step failed (its own exit code), or waiting for another node's result timed out (75)."""


@dataclass(frozen=True)
class PrepareResult:
    key: str
    path: Path  # <cache_root>/<key>: the prepared data
    cache_hit: bool  # True: nothing was run by this call
    prepared_by: PreparedBy
    waited_s: float  # time spent waiting for a lock or for another node
    run_s: float  # time the command ran in this call (0 on a hit)
    total_s: float
    stamp: Mapping[str, Any] = field(default_factory=dict)  # what the stamp records (timings, key parts...)


def cache_key(command: Command, key_parts: Mapping[str, Any]) -> str:
    """Hash of the declared key parts plus the command. Order of key_parts does not matter; a callable
    counts by its qualified name (add a version to key_parts when its body changes)."""
    return hashlib.sha256(_key_material(command, key_parts).encode()).hexdigest()[:24]


def prepare_once(
    command: Command,
    *,
    cache_root: str | os.PathLike[str],
    key_parts: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    shared_storage: bool = False,
    node_rank: int | None = None,
    wait_timeout_s: float = 3600.0,
    progress_every_s: float = 10.0,
) -> PrepareResult:
    """Make sure `<cache_root>/<key>/` holds the complete output of `command`, running it at most once.

    command: an argv list (run with the env plus PODGUARD_PREPARE_DIR/KEY; its output goes to ours) or
    a callable taking the directory to write. Its progress lines are podguard lines (console: stderr).
    shared_storage/node_rank: when the cache is shared between nodes, only node 0 (NODE_RANK/GROUP_RANK
    from the env by default) prepares; other nodes wait up to wait_timeout_s for its stamp.
    Raises UsageError (64) for bad arguments, PrepareError with the command's exit code when it fails,
    or with 75 when waiting for node 0 or for a lock times out.
    """
    started = time.monotonic()
    _validate(command, key_parts, wait_timeout_s, progress_every_s)
    root = Path(cache_root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"prepare cache root {str(root)!r} cannot be created ({exc.strerror})") from None
    key = cache_key(command, key_parts)
    final = root / key
    stamp = _read_stamp(final, key)
    if stamp is not None:
        return PrepareResult(key, final, True, PreparedBy.CACHE, 0.0, 0.0, time.monotonic() - started, stamp)
    node = _node_rank() if node_rank is None else node_rank
    if shared_storage and node != 0:
        return _wait_for_node0(key, final, started, wait_timeout_s, progress_every_s, node)
    with _key_lock(root, key, progress_every_s, wait_timeout_s) as waited:
        stamp = _read_stamp(final, key)  # the process we waited for may have done it
        if stamp is not None:
            console.say(f"prepare {key}: done by another process while we waited {waited:.1f}s; using it")
            total = time.monotonic() - started
            return PrepareResult(key, final, True, PreparedBy.ANOTHER_PROCESS, waited, 0.0, total, stamp)
        clean_stale(root, key, has_stamp=lambda folder: _read_stamp(folder, key) is not None)
        result = _prepare(command, key, key_parts, final, env)
        return replace(result, waited_s=waited, total_s=time.monotonic() - started)


# ----------------------------------------------------------------------------------------------------
# the run itself: temp folder, stamp, rename (the commit)


def _prepare(
    command: Command,
    key: str,
    key_parts: Mapping[str, Any],
    final: Path,
    env: Mapping[str, str] | None,
) -> PrepareResult:
    tmp = final.with_name(f"{TMP_PREFIX}{key}-{unique_suffix()}")
    tmp.mkdir()
    try:
        console.say(f"prepare {key}: running {_describe(command)} -> {final}")
        run_started = time.monotonic()
        _run(command, tmp, key, env)
        run_s = time.monotonic() - run_started
        stamp = {
            "key": key,
            "key_version": _KEY_VERSION,
            "key_parts": redact_env({k: str(v) for k, v in key_parts.items()}),
            "command": _describe(command),
            "run_s": round(run_s, 3),
            "created_at": time.time(),
            "host": host_id(),
            "pid": os.getpid(),
        }
        write_private(tmp / STAMP_NAME, json.dumps(stamp, indent=2) + "\n")
        _fsync_dir(tmp)
        published = _publish(tmp, final, key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if published is not None:  # another pod on the same volume was faster: use its result
        shutil.rmtree(tmp, ignore_errors=True)
        console.say(f"prepare {key}: another host published it first; using its result and dropping ours")
        return PrepareResult(key, final, True, PreparedBy.ANOTHER_HOST, 0.0, run_s, 0.0, published)
    console.say(f"prepare {key}: done in {run_s:.2f}s")
    return PrepareResult(key, final, False, PreparedBy.THIS_PROCESS, 0.0, run_s, 0.0, stamp)


def _publish(tmp: Path, final: Path, key: str) -> dict[str, Any] | None:
    """Rename the stamped temp folder into place. None when it is ours now; the winner's stamp when
    another host's result got there first (rename never replaces a non-empty folder)."""
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        stamp = _read_stamp(final, key)
        if stamp is None:
            raise PrepareError(
                f"prepare {key}: {final} appeared without a stamp while this run prepared it; run again",
                ExitCode.GPUS_BUSY,
            ) from None
        return stamp
    _fsync_dir(final.parent)
    return None


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ----------------------------------------------------------------------------------------------------
# the key's lock: host-local on volumes without flock; across pods the rename is what counts


@contextlib.contextmanager
def _key_lock(root: Path, key: str, every_s: float, timeout_s: float) -> Iterator[float]:
    """Hold the key's flock (yields the seconds waited). On a volume that refuses flock (ENOLCK on NFS
    without a lock daemon), lock in a host-local folder instead: processes of this host still take
    turns, and pods sharing the volume are kept apart by the atomic publish."""
    fd = open_lock(root / f".{key}.lock")
    try:
        try:
            waited = _wait_lock(fd, key, every_s, timeout_s)
        except NoFlock:
            os.close(fd)
            fd = -1
            console.say(f"prepare {key}: {root} has no file locks (a network volume?); locking on this host only")
            fd = open_lock(local_lock_dir("prepare") / f"{key}.lock")
            waited = _wait_lock(fd, key, every_s, timeout_s)
        yield waited
    finally:
        if fd >= 0:
            os.close(fd)  # releases the flock


def _wait_lock(fd: int, key: str, every_s: float, timeout_s: float) -> float:
    """Take the flock; while another process prepares, report progress now and then. Polls (short
    capped backoff) rather than blocking in the kernel, so that the wait has a deadline."""
    start = time.monotonic()
    if try_flock(fd):
        return 0.0
    console.say(f"prepare {key}: another process is preparing it; waiting")
    next_report = start + every_s
    delay = 0.01
    while not try_flock(fd):
        now = time.monotonic()
        if now - start >= timeout_s:
            raise PrepareError(
                f"prepare {key}: another process has been preparing it for {timeout_s:.0f}s (lock still held); "
                "giving up waiting",
                ExitCode.GPUS_BUSY,
            )
        if now >= next_report:
            console.say(f"prepare {key}: still waiting for another process ({now - start:.0f}s)")
            next_report = now + every_s
        time.sleep(min(delay, max(0.0, start + timeout_s - now)))
        delay = min(delay * 2, 0.2)
    return time.monotonic() - start


# ----------------------------------------------------------------------------------------------------
# pieces


def _validate(command: Command, key_parts: Mapping[str, Any], wait_timeout_s: float, every_s: float) -> None:
    if callable(command):
        pass
    elif isinstance(command, str | bytes) or not isinstance(command, Sequence):
        raise UsageError("prepare command must be an argument list (e.g. shlex.split(text)) or a callable")
    elif not command or not all(isinstance(a, str) for a in command) or not command[0].strip():
        raise UsageError(
            f"prepare command {redact_command(command)!r} is not valid; it must be a non-empty list of strings"
        )
    if not isinstance(key_parts, Mapping):
        raise UsageError("prepare key_parts must be a mapping of name -> value (model, dataset, context length...)")
    for name, value in key_parts.items():
        if not isinstance(name, str) or not name.strip():
            raise UsageError(f"prepare key part name {name!r} is not valid; it must be a non-empty string")
        if not isinstance(value, str | int | float | bool):
            raise UsageError(f"prepare key part {name}={value!r} is not valid; use a string or number")
    if not wait_timeout_s > 0:
        raise UsageError(f"prepare wait timeout {wait_timeout_s!r} is not valid; it must be > 0 seconds")
    if not every_s > 0:
        raise UsageError(f"prepare progress interval {every_s!r} is not valid; it must be > 0 seconds")


def _key_material(command: Command, key_parts: Mapping[str, Any]) -> str:
    cmd: Any = {"callable": _callable_name(command)} if callable(command) else list(command)
    parts = {k: [type(v).__name__, str(v)] for k, v in key_parts.items()}  # 1 and "1" are different values
    return json.dumps({"v": _KEY_VERSION, "command": cmd, "key_parts": parts}, sort_keys=True)


def _callable_name(command: Callable[..., Any]) -> str:
    """module.qualname of a function, or of the class of a callable object (never a repr: reprs can
    carry memory addresses, which would give every process its own key)."""
    target = command if hasattr(command, "__qualname__") else type(command)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def _describe(command: Command) -> str:
    """How the command appears in progress lines and the stamp: secrets masked."""
    return f"{_callable_name(command)}()" if callable(command) else redact_command(command)


def _read_stamp(final: Path, key: str) -> dict[str, Any] | None:
    """The stamp if it exists, parses, and is for this key; None otherwise (treated as "not prepared")."""
    try:
        data = json.loads((final / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def _run(command: Command, tmp: Path, key: str, env: Mapping[str, str] | None) -> None:
    if callable(command):
        command(tmp)
        return
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env[ENV_PREPARE_DIR] = str(tmp)
    child_env[ENV_PREPARE_KEY] = key
    try:
        parent = os.getpid()
        proc = subprocess.Popen(
            list(command), env=child_env, stdin=subprocess.DEVNULL, preexec_fn=lambda: _die_with_parent(parent)
        )
    except FileNotFoundError:
        raise UsageError(f"prepare command not found: {shlex.quote(command[0])}") from None
    except PermissionError:
        raise UsageError(f"prepare command is not executable: {shlex.quote(command[0])}") from None
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C / SIGTERM in us: the step must not go on writing without us
        _stop(proc)
        raise
    if code != 0:
        exit_code = signal_exit_code(-code) if code < 0 else code
        what = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        raise PrepareError(f"prepare command {_describe(command)} {what}; nothing was cached", exit_code)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGKILL it if we die (PR_SET_PDEATHSIG), so a SIGKILLed prepare does not
    leave its step running and writing into a directory the next run will clean up. If the parent is
    already gone (it died between fork and prctl), die now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except Exception:  # not Linux: the temp dir is still cleaned by the next run
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_node0(
    key: str, final: Path, started: float, timeout_s: float, every_s: float, node: int
) -> PrepareResult:
    """Another node prepares into shared storage: poll for its stamp (short capped backoff, deadline)."""
    console.say(f"prepare {key}: node {node} waits for node 0 to prepare {final} (timeout {timeout_s:.0f}s)")
    deadline = started + timeout_s
    next_report = time.monotonic() + every_s
    delay = 0.02
    while (stamp := _read_stamp(final, key)) is None:
        now = time.monotonic()
        if now >= deadline:
            raise PrepareError(
                f"prepare {key}: node {node} waited {timeout_s:.0f}s for node 0 to prepare {final} on shared "
                "storage and no stamp appeared; check node 0's log, or set shared storage off to prepare per node",
                ExitCode.GPUS_BUSY,
            )
        if now >= next_report:
            console.say(f"prepare {key}: still waiting for node 0 ({now - started:.0f}s of {timeout_s:.0f}s)")
            next_report = now + every_s
        time.sleep(max(0.0, min(delay, deadline - now)))
        delay = min(delay * 2, 0.5)
    waited = time.monotonic() - started
    console.say(f"prepare {key}: node 0 finished; waited {waited:.1f}s")
    return PrepareResult(key, final, True, PreparedBy.NODE0, waited, 0.0, waited, stamp)


def _node_rank() -> int:
    for name in ("NODE_RANK", "GROUP_RANK"):
        raw = (os.environ.get(name) or "").strip()
        if raw:
            if not raw.isdigit():
                raise UsageError(f"{name}={raw!r} is not valid; it must be an integer >= 0")
            return int(raw)
    return 0

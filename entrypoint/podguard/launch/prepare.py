"""Prepare once: run a data/tokenizer preparation step once per cache key, never twice, never half.

Seed: "dataset is prepared once before multi-GPU training starts", done by every rank at once (eight
copies racing to write the same files) or behind an "if exists" check that a killed run defeats (a
half-written directory looks prepared). Here:

* the cache key is a hash of what the user declares the result depends on (model/tokenizer, dataset,
  context length, sample count, any values) plus the command itself;
* the result is produced in a temp dir next to `<cache_root>/<key>/`, renamed into place atomically,
  and the stamp file is written last (atomically too): a stamp means "complete", nothing else does;
* a matching stamp skips the step; concurrent runs wait on an `flock` (kernel-released, so a killed
  preparer never blocks the next one) and then find the stamp instead of repeating the work;
* a killed prepare leaves no stamp; the next run removes its temp dir and half-renamed result;
* multi-node: with the cache on shared storage only node 0 prepares and the other nodes wait for its
  stamp (with a timeout and progress lines); otherwise every node prepares its own copy.

The command gets `PODGUARD_PREPARE_DIR` (where to write) and `PODGUARD_PREPARE_KEY` in its env; a Python
callable gets the directory as its argument.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podguard.errors import ExitCode, PodguardError, UsageError

ENV_PREPARE_DIR = "PODGUARD_PREPARE_DIR"
ENV_PREPARE_KEY = "PODGUARD_PREPARE_KEY"
STAMP_NAME = ".podguard-prepared.json"
_TMP_PREFIX = ".tmp-"
_KEY_VERSION = 1  # bump when the key's recipe changes, so old caches are not mistaken for new ones

Command = Sequence[str] | Callable[[Path], Any]
Progress = Callable[[str], None]


class PrepareError(PodguardError):
    """The prepare step failed (its own exit code), or waiting for another node's result timed out (75)."""


@dataclass(frozen=True)
class PrepareResult:
    key: str
    path: Path  # <cache_root>/<key>: the prepared data
    cache_hit: bool  # True: nothing was run by this call
    prepared_by: str  # "this process", "another process" (waited for it), "cache", "node 0"
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
    progress: Progress | None = None,
    shared_storage: bool = False,
    node_rank: int | None = None,
    wait_timeout_s: float = 3600.0,
    progress_every_s: float = 10.0,
) -> PrepareResult:
    """Make sure `<cache_root>/<key>/` holds the complete output of `command`, running it at most once.

    command: an argv list (run with the env plus PODGUARD_PREPARE_DIR/KEY; its output goes to ours) or
    a callable taking the directory to write. progress: receives human-readable lines (default: stderr).
    shared_storage/node_rank: when the cache is shared between nodes, only node 0 (NODE_RANK/GROUP_RANK
    from the env by default) prepares; other nodes wait up to wait_timeout_s for its stamp.
    Raises UsageError (64) for bad arguments, PrepareError with the command's exit code when it fails,
    or with 75 when waiting for node 0 times out.
    """
    started = time.monotonic()
    say = progress or _default_progress
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
        return PrepareResult(key, final, True, "cache", 0.0, 0.0, time.monotonic() - started, stamp)

    node = _node_rank() if node_rank is None else node_rank
    if shared_storage and node != 0:
        return _wait_for_node0(key, final, started, say, wait_timeout_s, progress_every_s, node)

    lock_path = root / f".{key}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        waited = _lock(fd, key, say, progress_every_s, wait_timeout_s)
        stamp = _read_stamp(final, key)  # the process we waited for may have done it
        if stamp is not None:
            say(f"prepare {key}: done by another process while we waited {waited:.1f}s; using it")
            return PrepareResult(key, final, True, "another process", waited, 0.0, time.monotonic() - started, stamp)
        _clean_stale(root, key, final, say)
        run_started = time.monotonic()
        tmp = root / f"{_TMP_PREFIX}{key}-{os.getpid()}"
        tmp.mkdir()
        try:
            say(f"prepare {key}: running {_describe(command)} -> {final}")
            _run(command, tmp, key, env)
            run_s = time.monotonic() - run_started
            os.rename(tmp, final)  # atomic: the result appears whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        stamp = {
            "key": key,
            "key_version": _KEY_VERSION,
            "key_parts": {k: str(v) for k, v in key_parts.items()},
            "command": _describe(command),
            "run_s": round(run_s, 3),
            "created_at": time.time(),
            "host": os.uname().nodename,
            "pid": os.getpid(),
        }
        _write_stamp(final, stamp)  # last: only now is the result "prepared"
        say(f"prepare {key}: done in {run_s:.2f}s")
        return PrepareResult(key, final, False, "this process", waited, run_s, time.monotonic() - started, stamp)
    finally:
        os.close(fd)  # releases the flock


# ----------------------------------------------------------------------------------------------------
# pieces


def _validate(command: Command, key_parts: Mapping[str, Any], wait_timeout_s: float, every_s: float) -> None:
    if callable(command):
        pass
    elif isinstance(command, str | bytes) or not isinstance(command, Sequence):
        raise UsageError("prepare command must be an argument list (e.g. shlex.split(text)) or a callable")
    elif not command or not all(isinstance(a, str) for a in command) or not command[0].strip():
        raise UsageError(f"prepare command {list(command)!r} is not valid; it must be a non-empty list of strings")
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
    if callable(command):
        return f"{_callable_name(command)}()"
    import shlex

    return shlex.join(command)


def _read_stamp(final: Path, key: str) -> dict[str, Any] | None:
    """The stamp if it exists, parses, and is for this key; None otherwise (treated as "not prepared")."""
    try:
        data = json.loads((final / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def _write_stamp(final: Path, stamp: Mapping[str, Any]) -> None:
    """Write-then-rename and fsync, so the stamp is never seen half-written, and survives a crash."""
    tmp = final / f"{STAMP_NAME}.tmp"
    with open(tmp, "w") as fh:
        json.dump(stamp, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final / STAMP_NAME)
    for directory in (final, final.parent):
        try:
            dfd = os.open(directory, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


def _lock(fd: int, key: str, say: Progress, every_s: float, timeout_s: float) -> float:
    """Take the key's flock; while waiting (another process is preparing), report progress now and then.
    Polls (short capped backoff) rather than blocking in the kernel so the wait has a deadline."""
    start = time.monotonic()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return 0.0
    except BlockingIOError:
        pass
    say(f"prepare {key}: another process is preparing it; waiting")
    next_report = start + every_s
    delay = 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return time.monotonic() - start
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now - start >= timeout_s:
            raise PrepareError(
                f"prepare {key}: another process has been preparing it for {timeout_s:.0f}s (lock still held); "
                "giving up waiting",
                ExitCode.GPUS_BUSY,
            )
        if now >= next_report:
            say(f"prepare {key}: still waiting for another process ({now - start:.0f}s)")
            next_report = now + every_s
        time.sleep(min(delay, max(0.0, start + timeout_s - now)))
        delay = min(delay * 2, 0.2)


def _clean_stale(root: Path, key: str, final: Path, say: Progress) -> None:
    """Under the lock, anything for this key without a stamp is debris of a killed run: remove it."""
    for leftover in root.glob(f"{_TMP_PREFIX}{key}-*"):
        say(f"prepare {key}: removing {leftover.name} left by an interrupted run")
        shutil.rmtree(leftover, ignore_errors=True)
    if final.exists():
        say(f"prepare {key}: removing {final} (no stamp: an interrupted run)")
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final, ignore_errors=True)
        else:
            final.unlink(missing_ok=True)


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
        raise UsageError(f"prepare command not found: {command[0]!r}") from None
    except PermissionError:
        raise UsageError(f"prepare command is not executable: {command[0]!r}") from None
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C / SIGTERM in us: the step must not go on writing without us
        _stop(proc)
        raise
    if code != 0:
        exit_code = 128 - code if code < 0 else code
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
    key: str, final: Path, started: float, say: Progress, timeout_s: float, every_s: float, node: int
) -> PrepareResult:
    """Another node prepares into shared storage: poll for its stamp (short capped backoff, deadline)."""
    say(f"prepare {key}: node {node} waits for node 0 to prepare {final} (timeout {timeout_s:.0f}s)")
    deadline = started + timeout_s
    next_report = time.monotonic() + every_s
    delay = 0.02
    while True:
        stamp = _read_stamp(final, key)
        if stamp is not None:
            waited = time.monotonic() - started
            say(f"prepare {key}: node 0 finished; waited {waited:.1f}s")
            return PrepareResult(key, final, True, "node 0", waited, 0.0, waited, stamp)
        now = time.monotonic()
        if now >= deadline:
            raise PrepareError(
                f"prepare {key}: node {node} waited {timeout_s:.0f}s for node 0 to prepare {final} on shared "
                "storage and no stamp appeared; check node 0's log, or set shared storage off to prepare per node",
                ExitCode.GPUS_BUSY,
            )
        if now >= next_report:
            say(f"prepare {key}: still waiting for node 0 ({now - started:.0f}s of {timeout_s:.0f}s)")
            next_report = now + every_s
        time.sleep(max(0.0, min(delay, deadline - now)))
        delay = min(delay * 2, 0.5)


def _node_rank() -> int:
    for name in ("NODE_RANK", "GROUP_RANK"):
        raw = (os.environ.get(name) or "").strip()
        if raw:
            if not raw.isdigit():
                raise UsageError(f"{name}={raw!r} is not valid; it must be an integer >= 0")
            return int(raw)
    return 0


def _default_progress(line: str) -> None:
    sys.stderr.write(f"[podguard] {line}\n")
    sys.stderr.flush()

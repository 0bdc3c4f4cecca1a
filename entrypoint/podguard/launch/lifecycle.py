"""After the job: record its outcome, apply `--on-exit`, and keep a crashing job from crash-looping.

RunPod (like `docker run --restart`) restarts a container whose main process exits. Without memory of
earlier runs that means (a) a job that *finished* runs again from scratch, and (b) a job that crashes
at start (bad config, missing file, broken GPU) restarts in a tight loop, burning money and flooding
the logs. So every run's outcome is recorded in the state dir (on `/workspace`, which survives
restarts), and the next start looks at that history first.

Records: `<state>/jobs/<key>.json` — `{"key", "command", "mode", "history": [run, ...]}` with the last
`HISTORY_MAX` runs, each `{"exit_code", "root_cause", "detail", "signal", "started_at", "ended_at",
"duration_s", "container", "host", "pid"}`. `key` identifies "the same job": the command, the mode, the
working directory and whatever the caller adds (e.g. GPU_LIST, so sweep runs on different GPUs are
different jobs). Writes are atomic (temp file + rename) under an `flock`.

Restart policy (`plan_launch`), decided and documented here:

* It only applies when this process is the container's *entry process* — PID 1, or a direct child of
  PID 1 (`tini`/`docker-init`, or a start command `bash -c "podguard train ..."`) — and the previous
  record comes from a *different container instance* (kernel boot id + PID 1's start time). That is
  exactly "the container was restarted". A person who runs the command again by hand (a shell in the
  container, `docker exec`, a second command in the same start script) always gets a fresh run.
* **Finished job**: when the latest record exited 0, it is not run again (`action="skip"`) unless
  `rerun=True` (`--rerun`). The caller then applies `--on-exit` (e.g. `idle`), so the pod stays up
  with the results instead of re-training or restart-looping.
* **Crash loop**: when the latest `k >= 2` records are consecutive *quick crashes* (non-zero exit
  within `QUICK_CRASH_S` = 60 s of starting, not ended by a signal — a `docker stop` is not a crash)
  and the last one ended less than `LOOP_WINDOW_S` ago, the launch waits `min(10 s * 2**(k-2), 300 s)`
  first (`action="backoff"`): 10, 20, 40, … 300 s. The first retry is immediate (a transient failure
  should not cost time). The wait is announced, counts down every 10 s, and ends early on SIGTERM /
  SIGINT / SIGHUP (the caller then exits 128+N): a deliberate pause, not a blind sleep.

`--on-exit`: `exit` (default: exit with the job's code), `idle` (keep the container alive after the job
ended: print where the outcome is recorded and wait for a signal, reaping orphans if PID 1), `stop-pod`
(reserved for the RunPod integration; refused for now with a clear message).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from podguard.errors import UsageError
from podguard.launch.spec import JobOutcome
from podguard.state import state_dir, subdir

ON_EXIT_CHOICES = ("exit", "idle", "stop-pod")
HISTORY_MAX = 20
QUICK_CRASH_S = 60.0
LOOP_WINDOW_S = 30 * 60.0
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
COUNTDOWN_STEP_S = 10.0
_WAKE_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def validate_on_exit(value: str) -> str:
    if value == "stop-pod":
        raise UsageError(
            "--on-exit stop-pod needs the RunPod integration, which this version does not have yet; "
            "use --on-exit exit or --on-exit idle"
        )
    if value not in ON_EXIT_CHOICES:
        raise UsageError(f"--on-exit {value!r} is not valid; choose one of: exit, idle (stop-pod: coming)")
    return value


def job_key(
    argv: Sequence[str], mode: str, *, cwd: str | os.PathLike[str] | None = None, extra: Sequence[str] = ()
) -> str:
    """A stable id for "the same job" (see the module docstring)."""
    material = json.dumps([list(argv), mode, str(cwd if cwd is not None else os.getcwd()), list(extra)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def container_identity() -> str:
    """Changes when the container (its PID 1) restarts or the machine reboots."""
    parts = []
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    try:
        raw = Path("/proc/1/stat").read_bytes()
        parts.append(raw[raw.rfind(b")") + 2 :].split()[19].decode())  # field 22: starttime
    except (OSError, IndexError):
        parts.append("?")
    return ":".join(parts)


def is_entry_process() -> bool:
    """PID 1, or started directly by PID 1 (an init such as tini, or `bash -c` as the start command)."""
    return os.getpid() == 1 or os.getppid() == 1


def _jobs_dir(state: Path | None) -> Path:
    return subdir(state if state is not None else state_dir(), "jobs")


def _record_path(key: str, state: Path | None) -> Path:
    return _jobs_dir(state) / f"{key}.json"


@contextlib.contextmanager
def _locked(path: Path):  # type: ignore[no-untyped-def]
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_run(
    *,
    key: str,
    argv: Sequence[str],
    mode: str,
    exit_code: int,
    started_at: float,
    ended_at: float | None = None,
    detail: str = "",
    root_cause: str | None = None,
    signal_num: int | None = None,
    state: Path | None = None,
) -> Path:
    """Append one run (times are epoch seconds) to the job's record; returns the record's path.

    Also for runs that ended before a job started (a failed preflight exits 64/69/75/76): those crash
    loops need the same backoff.
    """
    ended = time.time() if ended_at is None else ended_at
    path = _record_path(key, state)
    run = {
        "exit_code": exit_code,
        "root_cause": root_cause,
        "detail": detail,
        "signal": signal_num,
        "started_at": started_at,
        "ended_at": ended,
        "duration_s": round(max(0.0, ended - started_at), 3),
        "container": container_identity(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    with _locked(path):
        data = _read(path)
        history = [h for h in data.get("history", []) if isinstance(h, dict)]
        history = [*history, run][-HISTORY_MAX:]
        _write_atomic(path, {"key": key, "command": list(argv), "mode": mode, "history": history})
    return path


def record_outcome(
    outcome: JobOutcome,
    *,
    key: str,
    argv: Sequence[str],
    mode: str,
    started_at: float,
    ended_at: float | None = None,
    state: Path | None = None,
) -> Path:
    """`record_run` for a supervised job's `JobOutcome`."""
    root = outcome.root_cause
    return record_run(
        key=key,
        argv=argv,
        mode=mode,
        exit_code=outcome.exit_code,
        started_at=started_at,
        ended_at=ended_at,
        detail=outcome.detail,
        root_cause=root.name if root is not None else None,
        signal_num=outcome.signal,
        state=state,
    )


def load_history(key: str, state: Path | None = None) -> list[dict[str, Any]]:
    data = _read(_record_path(key, state))
    return [h for h in data.get("history", []) if isinstance(h, dict)]


@dataclass(frozen=True)
class LaunchDecision:
    action: str  # "run", "skip" (finished before), "backoff" (wait delay_s, then run)
    reason: str = ""
    delay_s: float = 0.0
    record: Path | None = None


def _is_quick_crash(run: Mapping[str, Any]) -> bool:
    return (
        run.get("exit_code", 0) != 0
        and run.get("signal") is None
        and float(run.get("duration_s", QUICK_CRASH_S)) < QUICK_CRASH_S
    )


def backoff_delay(consecutive_quick_crashes: int) -> float:
    """0 for the first crash, then 10, 20, 40, … capped at 300 s."""
    if consecutive_quick_crashes < 2:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (consecutive_quick_crashes - 2))


def plan_launch(
    key: str,
    *,
    rerun: bool = False,
    entry: bool | None = None,
    state: Path | None = None,
    now: float | None = None,
    container: str | None = None,
) -> LaunchDecision:
    """What to do before launching the job again; see the module docstring for the policy."""
    path = _record_path(key, state)
    history = load_history(key, state)
    entry = is_entry_process() if entry is None else entry
    if not history or not entry:
        return LaunchDecision("run", record=path)
    current = container_identity() if container is None else container
    last = history[-1]
    if last.get("container") == current:
        return LaunchDecision("run", "same container instance: a deliberate re-run", record=path)
    if last.get("exit_code") == 0 and not rerun:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(last.get("ended_at", 0))))
        return LaunchDecision(
            "skip", f"this job already finished successfully at {when}; pass --rerun to run it again", record=path
        )
    streak = 0
    for run in reversed(history):
        if not _is_quick_crash(run):
            break
        streak += 1
    now = time.time() if now is None else now
    recent = now - float(last.get("ended_at", 0)) < LOOP_WINDOW_S
    delay = backoff_delay(streak) if recent else 0.0
    if delay > 0:
        return LaunchDecision(
            "backoff",
            f"the job crashed within {QUICK_CRASH_S:g} s of starting {streak} times in a row "
            f"(last: exit {last.get('exit_code')}); waiting {delay:g} s before launching again",
            delay_s=delay,
            record=path,
        )
    return LaunchDecision("run", record=path)


# --------------------------------------------------------------------------------------------------
# Waiting for signals (backoff countdown, idle)


def _noop(signum: int, frame: object) -> None:
    """A handler, so that PID 1 does not have these signals discarded."""


def _reap_all() -> None:
    """As PID 1, every orphan in the container is ours to reap."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_for_signal(timeout: float | None) -> int | None:
    """Wait up to `timeout` s (None = forever) for SIGTERM/SIGINT/SIGHUP; the signal, or None."""
    watched = set(_WAKE_SIGNALS)
    reap = os.getpid() == 1
    if reap:
        watched.add(signal.SIGCHLD)
    old = {sig: signal.getsignal(sig) for sig in watched}
    for sig in watched:
        signal.signal(sig, _noop)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if deadline is None:
                info = signal.sigwaitinfo(watched)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                info = signal.sigtimedwait(watched, left)
                if info is None:
                    return None
            if info.si_signo == signal.SIGCHLD:
                _reap_all()
                continue
            return info.si_signo
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _say(out: TextIO | None, text: str) -> None:
    stream = out if out is not None else sys.stderr
    stream.write(f"podguard: {text}\n")
    stream.flush()


def backoff_wait(
    decision: LaunchDecision, *, out: TextIO | None = None, step_s: float = COUNTDOWN_STEP_S
) -> int | None:
    """The announced crash-loop pause: countdown lines, interruptible. Returns the signal, or None."""
    _say(out, f"{decision.reason} (SIGTERM or Ctrl-C to stop; outcome history: {decision.record})")
    left = decision.delay_s
    while left > 0:
        got = wait_for_signal(min(step_s, left))
        if got is not None:
            _say(out, f"received {signal.Signals(got).name} during the crash-loop pause; not launching")
            return got
        left -= min(step_s, left)
        if left > 0:
            _say(out, f"launching again in {left:.0f} s")
    return None


def idle(exit_code: int, record: Path | None, *, out: TextIO | None = None) -> int:
    """`--on-exit idle`: keep the container alive until a signal; returns the job's exit code."""
    where = f"; outcome recorded in {record}" if record is not None else ""
    _say(
        out,
        f"job ended with exit code {exit_code}{where}. Idling to keep the container up (--on-exit idle); "
        "stop the pod or send SIGTERM to end",
    )
    got = wait_for_signal(None)
    if got is not None:
        _say(out, f"received {signal.Signals(got).name}; leaving (job exit code {exit_code})")
    return exit_code

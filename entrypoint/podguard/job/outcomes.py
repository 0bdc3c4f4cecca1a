"""How each run of a job ended, kept in `<state>/jobs/<key>.json` so that a restarted container knows.

    key = job_key(["python", "train.py"], "per-gpu", extra=[gpu_list])  # this job on this pod
    record_run(key=key, argv=argv, mode="per-gpu", exit_code=0, started_at=t0, state=base)
    load_history(key, base)[-1].exit_code  # 0

Writing is best-effort (a full volume costs the record, with one warning, never the exit code); command
lines and details are redacted; files are owner-only. The policy that reads them: `job/restart_guard.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from podguard.errors import ExitCode
from podguard.launch.spec import JobOutcome
from podguard.pods import thispod
from podguard.redact import redact_argv, redact_text
from podguard.state import NoFlock, local_lock_dir, lock_blocking, open_lock, state_dir, write_private

__all__ = [
    "HISTORY_MAX",
    "QUICK_CRASH_S",
    "RunKind",
    "RunRecord",
    "container_identity",
    "is_entry_process",
    "job_key",
    "load_history",
    "pod_identity",
    "record_outcome",
    "record_path",
    "record_run",
]

HISTORY_MAX = 20
QUICK_CRASH_S = 60.0
_warned = False


class RunKind(StrEnum):
    JOB = "job"  # the job was launched (whatever its exit)
    START = "start"  # the run ended before the job launched: preflight (64/69/75/76), prepare, bad command
    SKIP = "skip"  # the job had finished before and was not run again (consecutive skips merge: `count`)


@dataclass(frozen=True)
class RunRecord:
    """One exit of a run, as stored in the job's record (times are epoch seconds)."""

    exit_code: int
    started_at: float
    ended_at: float
    duration_s: float
    kind: RunKind = RunKind.JOB  # records written before kinds existed were jobs
    root_cause: str | None = None
    detail: str = ""
    signal: int | None = None
    container: str = ""
    pod: str = ""
    host: str = ""
    pid: int = 0
    count: int = 1

    @property
    def quick_crash(self) -> bool:
        """Failed within QUICK_CRASH_S of starting, not ended by a signal (a `docker stop` is no crash)."""
        return (
            self.kind is not RunKind.SKIP
            and self.exit_code != ExitCode.OK
            and self.signal is None
            and self.duration_s < QUICK_CRASH_S
        )


_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunRecord))


def _run_from(data: Any) -> RunRecord | None:
    """A stored run, or None when it is not one (a hand-edited or foreign file must not crash a start)."""
    if not isinstance(data, Mapping):
        return None
    try:
        run = RunRecord(**{k: v for k, v in data.items() if k in _RUN_FIELDS})
        return dataclasses.replace(
            run,
            kind=RunKind(run.kind),
            exit_code=int(run.exit_code),
            started_at=float(run.started_at),
            ended_at=float(run.ended_at),
            duration_s=float(run.duration_s),
            count=max(1, int(run.count)),
        )
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------
# Identity: which job, which pod, which container instance


def pod_identity() -> str:
    """RUNPOD_POD_ID, else the hostname: a new pod mounting the same network volume is another place."""
    return thispod.pod_id() or socket.gethostname()


def job_key(
    argv: Sequence[str],
    mode: str,
    *,
    cwd: str | os.PathLike[str] | None = None,
    pod: str | None = None,
    extra: Sequence[str] = (),
) -> str:
    """A stable id for "this job on this pod": the command, the mode, the working directory, the pod and
    whatever the caller adds (GPU_LIST: sweep runs on different GPUs are different jobs)."""
    where = str(cwd if cwd is not None else os.getcwd())
    material = json.dumps([list(argv), str(mode), where, pod if pod is not None else pod_identity(), list(extra)])
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


# --------------------------------------------------------------------------------------------------
# Records (best-effort: a full or read-only volume costs the record, never the job's exit code)


def record_path(key: str, state: Path | None = None) -> Path:
    return (state if state is not None else state_dir()) / "jobs" / f"{key}.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The record's flock; host-local when the volume has no flock (records are per pod anyway)."""
    lock = path.with_name(path.name + ".lock")
    fd = open_lock(lock)
    try:
        try:
            lock_blocking(fd)
        except NoFlock:
            os.close(fd)
            fd = -1
            fd = open_lock(local_lock_dir("jobs") / lock.name)
            lock_blocking(fd)
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def load_history(key: str, state: Path | None = None) -> list[RunRecord]:
    try:
        data = json.loads(record_path(key, state).read_text())
    except (OSError, ValueError):
        return []
    history = data.get("history", []) if isinstance(data, dict) else []
    return [run for run in map(_run_from, history if isinstance(history, list) else []) if run is not None]


def _appended(history: list[RunRecord], run: RunRecord) -> list[RunRecord]:
    if run.kind is RunKind.SKIP and history and history[-1].kind is RunKind.SKIP:
        run = dataclasses.replace(run, count=history[-1].count + 1)  # a skip loop must not push the job out
        history = history[:-1]
    return [*history, run][-HISTORY_MAX:]


def _warn_once(text: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        sys.stderr.write(f"podguard: warning: {text}\n")
        sys.stderr.flush()


def record_run(
    *,
    key: str,
    argv: Sequence[str],
    mode: str,
    exit_code: int,
    started_at: float,
    ended_at: float | None = None,
    kind: RunKind = RunKind.JOB,
    detail: str = "",
    root_cause: str | None = None,
    signal_num: int | None = None,
    state: Path | None = None,
) -> Path | None:
    """Append one run to the job's record; the record's path, or None (after one warning) when it could
    not be written. Never raises OSError: the caller's exit code must not depend on the volume."""
    ended = time.time() if ended_at is None else ended_at
    run = RunRecord(
        exit_code=int(exit_code),
        started_at=started_at,
        ended_at=ended,
        duration_s=round(max(0.0, ended - started_at), 3),
        kind=kind,
        root_cause=root_cause,
        detail=redact_text(detail),
        signal=signal_num,
        container=container_identity(),
        pod=pod_identity(),
        host=socket.gethostname(),
        pid=os.getpid(),
    )
    path = record_path(key, state)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            history = _appended(load_history(key, state), run)
            data = {"key": key, "command": redact_argv(argv), "mode": str(mode), "pod": run.pod}
            data["history"] = [dataclasses.asdict(h) for h in history]
            write_private(path, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        _warn_once(
            f"could not record how this run ended in {path} ({exc.strerror or exc}); the exit code is "
            "unaffected, but a restarted container will not know this run's outcome"
        )
        return None
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
    root_cause: str | None = None,
) -> Path | None:
    """`record_run` for a supervised job's `JobOutcome`; `root_cause` overrides the failed worker's name (a GPU
    fault the run-time watch found: "GPU 0 Xid 95")."""
    root = outcome.root_cause
    return record_run(
        key=key,
        argv=argv,
        mode=mode,
        exit_code=outcome.exit_code,
        started_at=started_at,
        ended_at=ended_at,
        detail=outcome.detail,
        root_cause=root_cause or (root.name if root is not None else None),
        signal_num=outcome.signal,
        state=state,
    )

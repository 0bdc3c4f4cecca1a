"""Records shared by every launch mode: what to start, how each worker ended, how the job ended.

    spec = WorkerSpec("GPU0", ("python", "train.py"), env={"RANK": "0"}, prefix="GPU0:")
    outcome = run_job([spec])          # -> JobOutcome(exit_code, workers, root_cause, signal, detail)

The job outcome names the root cause (the first worker that failed), its exit code or signal, and its
last log lines (torch.distributed.elastic's structured failure records, in spirit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from podguard.errors import signal_exit_code
from podguard.records import Record

__all__ = ["JobOutcome", "WorkerExit", "WorkerSpec"]


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # stable id: "GPU0", "rank1", "server", "trainer2"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added on top of os.environ
    prefix: str = ""  # put before every output line, e.g. "GPU0:"; "" = none
    log_path: Path | None = None  # every line (unprefixed) also goes here
    cwd: Path | None = None
    # A long-running helper (roles: an inference server). The job is done when every non-service
    # worker has finished; services are then stopped. A service that exits before that is a failure.
    service: bool = False
    label: str = ""  # how summaries name it, e.g. "GPU2 (rank 2)"; "" = the name
    gpus: tuple[int, ...] = ()  # NVML indices it sees (for --only-gpu and reports); () = CPU only
    inherit_env: bool = True  # False: `env` is the whole environment (sweeps strip conflicting variables)


@dataclass(frozen=True)
class WorkerExit(Record):
    name: str
    pid: int
    returncode: int | None  # exit status when it exited
    signal: int | None  # signal number when it was killed by one
    tail: tuple[str, ...] = ()  # its last output lines
    stopped_by_podguard: bool = False  # True when podguard stopped it (fail-fast, shutdown)
    duration_s: float | None = None  # from start to exit, when podguard started it
    first_error: tuple[str, ...] = ()  # its output's first traceback (several ranks in one pipe: the first by time)

    @property
    def failed(self) -> bool:
        return not self.stopped_by_podguard and (self.signal is not None or (self.returncode or 0) != 0)

    @property
    def exit_code(self) -> int:
        """The shell-style code: the exit status, or 128+N when killed by signal N."""
        if self.signal is not None:
            return signal_exit_code(self.signal)
        return self.returncode or 0


@dataclass(frozen=True)
class JobOutcome(Record):
    exit_code: int
    workers: tuple[WorkerExit, ...]
    root_cause: WorkerExit | None = None  # the first worker that failed
    signal: int | None = None  # the signal podguard itself received, if that ended the job
    detail: str = ""  # e.g. "rank 1 (local 1) on node 0 exited 3: ValueError(...)" from torch error files

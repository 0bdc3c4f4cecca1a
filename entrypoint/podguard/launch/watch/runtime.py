"""The run-time watch of one attempt: progress and hangs, GPU faults, stragglers, on the supervisor's loop.

    watch = RuntimeWatch(RuntimeSettings(hang_timeout_s=1800, gpus=((0, "GPU-..."),)), run_dir, say=print)
    env = watch.worker_env(slots=8)          # the heartbeat board (and the flight recorder, with a hang timeout)
    outcome = watch.explain(run_job(specs, watch=watch))   # 79 for a hang, 76 for a GPU fault, with the cause

One timer on the supervisor's loop (every `tick_s`): read the heartbeat board (one small file), poll the GPU
fault watch (NVML, non-blocking), check progress and stragglers. Output lines reach `ProgressWatch` through the
printer's line callbacks. When the job is hung: one line saying so, the evidence (torch's flight recorder,
then every worker's Python stacks) taken on one helper thread while the loop goes on, a short per-rank summary,
a JSON record under the run's `hang/` folder, then the job is ended with 79. A fatal GPU fault is printed at
once and ends the job with 76; an application Xid is only printed. Rules and sources: docs/watch.md.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard.errors import ExitCode
from podguard.launch.spec import JobOutcome
from podguard.launch.watch.progress import Hang, ProgressWatch
from podguard.launch.watch.stragglers import StepRates
from podguard.rank.progress import ENV_FILE, create_board, read_board

if TYPE_CHECKING:
    from podguard.launch.supervisor import Supervisor
    from podguard.launch.watch.gpu_faults import GpuFault, GpuFaultWatch

__all__ = ["RuntimeSettings", "RuntimeWatch"]

TICK_S = 1.0
EVIDENCE_TIMEOUT_S = 20.0  # the stacks and the flight recorder together, at most


@dataclass(frozen=True)
class RuntimeSettings:
    hang_timeout_s: float | None = None
    progress: re.Pattern[str] | None = None
    slow_ratio: float = 0.8
    gpus: tuple[tuple[int, str | None], ...] = ()  # the selected GPUs, (NVML index, UUID); () = CPU only
    slot_gpus: Mapping[int, int] = field(default_factory=dict)  # heartbeat slot (local rank) -> NVML index
    python: str | None = None  # the job's interpreter, where its command names one (its torch arms the recorder)
    line_prefix: re.Pattern[str] | None = None  # a launcher's prefix on the workers' lines (torchrun: `rank3: `)
    tick_s: float = TICK_S


class RuntimeWatch:
    """See the module docstring. `gpu_watch` replaces the NVML fault watch (tests); `say` prints a podguard line
    outside the supervisor (before it starts and after it ended)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        run_dir: Path,
        *,
        gpu_watch: GpuFaultWatch | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.board = run_dir / "heartbeats"
        self.evidence_dir = run_dir / "hang"
        self._gpu_watch = gpu_watch
        self._gpu_watch_tried = False
        self._say = say or (lambda text: None)
        self.sup: Supervisor | None = None
        self.progress = self._progress_watch()
        self.rates = StepRates(settings.slow_ratio)
        self.hang: Hang | None = None
        self.hang_lines: list[str] = []
        self.faults: list[GpuFault] = []
        self._timer: Any = None
        self._evidence: threading.Thread | None = None
        self._closed = False
        self.flight = False  # torch's flight recorder was armed for this attempt
        self.job_env: dict[str, str] = dict(os.environ)
        self.worker_gpus: dict[str, tuple[int, ...]] = {}

    def _progress_watch(self) -> ProgressWatch:
        st = self.settings
        return ProgressWatch(st.hang_timeout_s, st.progress, time.monotonic(), strip=st.line_prefix)

    # -- before the launch --------------------------------------------------------------------------------
    def worker_env(self, slots: int) -> dict[str, str]:
        """What every worker gets: the heartbeat board, and (with a hang timeout) torch's flight recorder."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._open_gpu_watch()  # before the workers: a fault from now on is a fault, not the starting value
        create_board(self.board, max(1, slots))
        env = {ENV_FILE: str(self.board)}
        if self.settings.hang_timeout_s is not None:
            from podguard.launch.watch.flight import flight_recorder_env, installed_torch_version

            version = installed_torch_version(self.settings.python)
            armed = flight_recorder_env(self.evidence_dir / "flight", os.environ, torch_version=version)
            self.flight = bool(armed)
            env.update(armed)
        self.job_env = {**os.environ, **env}
        return env

    # -- the supervisor's Watch protocol -----------------------------------------------------------------
    def start(self, sup: Supervisor) -> None:
        self.sup = sup
        self.progress = self._progress_watch()
        sup.printer.watch_all(self._line)
        self._open_gpu_watch()
        self._schedule()

    def _open_gpu_watch(self) -> None:
        if self._gpu_watch is None and self.settings.gpus and not self._gpu_watch_tried:
            from podguard.launch.watch.gpu_faults import open_gpu_fault_watch

            self._gpu_watch_tried = True
            self._gpu_watch = open_gpu_fault_watch(self.settings.gpus)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._poll_faults(final=True)  # a fault that came with the workers' deaths is their root cause
        if self._gpu_watch is not None:
            self._gpu_watch.close()
        if self._evidence is not None:
            self._evidence.join(EVIDENCE_TIMEOUT_S)
        _write_json(self.run_dir / "watch.json", self.record())  # the run's record: hang, faults, stragglers

    # -- the loop -------------------------------------------------------------------------------------------
    def _schedule(self) -> None:
        assert self.sup is not None
        self._timer = self.sup.call_later(self.settings.tick_s, self._tick)

    def _line(self, worker: str, line: str) -> None:
        self.progress.line(worker, line, time.monotonic())

    def _tick(self) -> None:
        sup = self.sup
        assert sup is not None
        now = time.monotonic()
        board = read_board(self.board)
        for slot in self.progress.beats(board, now):
            beat = board[slot]
            if beat.step is not None:
                self.rates.observe(slot, beat.step, beat.at)
        for slow in self.rates.check(now):
            sup.message(f"warning: {self._rank(slow.slot)} {slow.text.removeprefix(f'rank {slow.slot} ')}")
        self._poll_faults()
        if self.hang is None and not sup.stopping and (hang := self.progress.check(now, alive=_pid_alive)) is not None:
            self._on_hang(hang)
        if not self._closed:
            self._schedule()

    def _rank(self, slot: int) -> str:
        """'rank 9 (GPU 1)': the global rank where the heartbeat told it, the GPU of its local slot."""
        gpu = self.settings.slot_gpus.get(slot)
        return f"rank {self.progress.labels.get(slot, slot)}" + (f" (GPU {gpu})" if gpu is not None else "")

    # -- GPU faults -------------------------------------------------------------------------------------
    def _poll_faults(self, final: bool = False, ending: bool = False) -> None:
        """`final`: after the supervisor (print outside it); `ending`: a worker just failed (print, the
        supervisor is ending the job anyway)."""
        if self._gpu_watch is None:
            return
        for fault in self._gpu_watch.poll():
            self.faults.append(fault)
            self._write_faults()
            if self.sup is None or final:
                self._say(f"podguard: {'GPU FAULT' if fault.fatal else 'GPU event'}: {fault.text}")
                continue
            if not fault.fatal:
                self.sup.message(f"GPU event ({_kind_of(fault)}, not acted on): {fault.text}")
            elif not self.sup.stopping and not ending:
                self.sup.fail(None, ExitCode.GPU_UNHEALTHY, f"GPU FAULT: {fault.text}: ending the job")
            else:
                self.sup.message(f"GPU FAULT: {fault.text}")

    def cause_of_exit(self, worker_gpus: tuple[int, ...], code: int) -> tuple[int, str] | None:
        """A worker failed on its own: a fatal fault (polled now, so that it is seen before the supervisor tells
        the worker's end), on one of its GPUs where there is one, is the root cause (supervisor.Watch)."""
        if code == 0:
            return None
        self._poll_faults(ending=True)
        fault = self.fault_of(worker_gpus)
        return None if fault is None else (ExitCode.GPU_UNHEALTHY, f"GPU FAULT first: {fault.text}")

    def fault_of(self, worker_gpus: Sequence[int]) -> GpuFault | None:
        """The first fatal fault on one of `worker_gpus`, else on any selected GPU: a rank that died of its peer's
        lost GPU (an NCCL error) died of the machine too, and the job ends 76 either way (a keeper replaces the
        machine on it)."""
        fatal = [f for f in self.faults if f.fatal]
        return next((f for f in fatal if f.index in worker_gpus), fatal[0] if fatal else None)

    def _write_faults(self) -> None:
        record = {"faults": [f.to_dict() for f in self.faults]}
        _write_json(self.run_dir / "gpu_faults.json", record)

    # -- hangs ----------------------------------------------------------------------------------------------
    def _on_hang(self, hang: Hang) -> None:
        sup = self.sup
        assert sup is not None
        self.hang = hang
        sup.message(f"HUNG: {hang.text}; keeping the evidence in {self.evidence_dir}")
        pids = {name: w.pid for name, w in sup.workers.items() if w.alive}
        self.worker_gpus = {name: tuple(w.spec.gpus) for name, w in sup.workers.items()}
        self._evidence = threading.Thread(target=self._collect, args=(hang, pids), name="podguard-hang", daemon=True)
        self._evidence.start()

    def _collect(self, hang: Hang, pids: dict[str, int]) -> None:
        """On the helper thread: the flight recorder first (its pipe needs the ranks alive), then the stacks."""
        lines: list[str] = []
        record: dict[str, Any] = {"hang": hang.to_dict(), "at": time.time()}
        try:
            lines, record = self._evidence_of(pids, record)
        except Exception as exc:  # evidence is best effort: the job is ended whatever happens here
            lines.append(f"could not keep the evidence: {type(exc).__name__}: {exc}")
        record["summary"] = lines
        _write_json(self.evidence_dir / "hang.json", record)
        self.hang_lines = lines
        if self.sup is not None:
            self.sup.call_from_thread(lambda: self._end_hung(hang, lines))

    def _evidence_of(self, pids: dict[str, int], record: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Every rank's stacks first (milliseconds, while everything is as it hung), then torch's flight recorder
        through its pipe (seconds: torch symbolizes its dump)."""
        from podguard.launch.watch.flight import trigger_flight_dump
        from podguard.launch.watch.stacks import capture_stacks, find_rank_processes, hang_summary

        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        gpus = {name: self.worker_gpus.get(name, ()) for name in pids}
        targets = [self._with_gpu(t) for t in find_rank_processes(pids, gpus=gpus)]
        stacks = capture_stacks(targets, self.evidence_dir / "stacks")
        record["stacks"] = [
            {
                "name": s.target.name,
                "pid": s.target.pid,
                "rank": s.target.rank,
                "gpu": s.target.gpu,
                "path": str(s.path) if s.path else None,
                "innermost_user_frame": s.innermost_user_frame,
                "collective": s.collective,
                "error": s.error,
                "duration_ms": round(s.duration_ms, 1),
            }
            for s in stacks
        ]
        lines = list(hang_summary(stacks))
        dumps = trigger_flight_dump(self.evidence_dir / "flight", environ=self.job_env) if self.flight else []
        record["flight_recorder"] = [str(p) for p in dumps]
        if dumps:
            lines.append(f"flight recorder: {len(dumps)} dump(s) in {self.evidence_dir / 'flight'}")
        return lines, record

    def _with_gpu(self, target: Any) -> Any:
        if target.gpu is None and target.local_rank is not None and target.local_rank in self.settings.slot_gpus:
            return replace(target, gpu=self.settings.slot_gpus[target.local_rank])
        return target

    def _end_hung(self, hang: Hang, lines: Sequence[str]) -> None:
        sup = self.sup
        assert sup is not None
        for line in lines:
            sup.message(line)
        who = f" (rank(s) {', '.join(map(str, hang.ranks))})" if hang.ranks else ""
        sup.fail(None, ExitCode.HUNG, f"job hung{who}")  # (the HUNG line above said why)

    # -- after the job --------------------------------------------------------------------------------------
    def explain(self, outcome: JobOutcome) -> JobOutcome:
        """The outcome with this watch's root cause: a fatal GPU fault makes a failure 76 (the fault, not the
        worker's own code; one seen only after the workers ended too), named on the failed worker's GPU where there
        is one; a hang is already 79. Stragglers join the detail."""
        detail = outcome.detail
        code = outcome.exit_code
        root = outcome.root_cause
        gpus = self.worker_gpus_of(root.name) if root is not None else ()
        fault = self.fault_of(gpus)
        if fault is not None and code not in (0, ExitCode.HUNG, ExitCode.GPU_UNHEALTHY) and outcome.signal is None:
            detail = f"GPU FAULT first: {fault.text}; then {detail}"
            code = ExitCode.GPU_UNHEALTHY
        if self.rates.named:
            slow = "; ".join(f"{self._rank(s.slot)} {s.text.removeprefix(f'rank {s.slot} ')}" for s in self.rates.named)
            detail = f"{detail}; stragglers: {slow}"
        if code == outcome.exit_code and detail == outcome.detail:
            return outcome
        return replace(outcome, exit_code=int(code), detail=detail)

    def root_cause(self, outcome: JobOutcome) -> str | None:
        """What the job's record names as the root cause: the fatal GPU fault ("GPU 0 Xid 95"), where it ended
        the job; None: the failed worker, as the supervisor said."""
        if outcome.exit_code != ExitCode.GPU_UNHEALTHY:
            return None
        root = outcome.root_cause
        fault = self.fault_of(self.worker_gpus_of(root.name) if root is not None else ())
        if fault is None:
            return None
        what = f"Xid {fault.xid}" if fault.xid is not None else fault.kind
        return f"GPU {fault.index} {what}" + (" (lost)" if fault.kind == "lost" and fault.xid is not None else "")

    def worker_gpus_of(self, name: str) -> tuple[int, ...]:
        sup = self.sup
        if sup is not None and name in sup.workers:
            return tuple(sup.workers[name].spec.gpus)
        return self.worker_gpus.get(name, ())

    def record(self) -> dict[str, Any]:
        """What this watch saw, as `<run>/watch.json` keeps it."""
        return {
            "hang": self.hang.to_dict() if self.hang else None,
            "hang_summary": self.hang_lines,
            "gpu_faults": [f.to_dict() for f in self.faults],
            "stragglers": [
                {**s.to_dict(), "rank": self.progress.labels.get(s.slot, s.slot), "local_rank": s.slot}
                for s in self.rates.named
            ],
            "progressed": self.progress.progressed,
        }


def _pid_alive(pid: int) -> bool:
    """A rank's process still runs (not gone, not a zombie); an unknown pid (0) counts as alive."""
    if pid <= 0:
        return True
    from podguard.procfs import read_stat

    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


def _kind_of(fault: GpuFault) -> str:
    """How a non-fatal fault is labelled: an application Xid is the job's own doing; others are only noted."""
    return "application-level" if fault.application else "not fatal to the job"


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Best effort (a full volume must not turn a hang into a traceback)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass

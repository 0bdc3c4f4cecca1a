"""The run-time watch of one attempt: progress and hangs, GPU faults, stragglers, on the supervisor's loop.

    watch = RuntimeWatch(RuntimeSettings(hang_timeout_s=1800, gpus=((0, "GPU-..."),)), run_dir)
    env = watch.worker_env(slots=8)          # the heartbeat board (and the flight recorder, with a hang timeout)
    outcome = watch.explain(run_job(specs, watch=watch))   # 79 for a hang, 76 for a GPU fault, with the cause

One timer on the supervisor's loop (every `tick_s`): read the heartbeat board (/dev/shm: board.py), take what
the GPU fault watch's thread found (NVML never runs on the loop: gpu_poller.py), take the other nodes' progress
on a multi-node run (launch/multinode/share.py), check progress and stragglers. Output lines reach
`ProgressWatch` through the printer's line callbacks. When the job is hung: one line saying so, the evidence
(every worker's Python stacks, then torch's flight recorder) taken on a helper thread (evidence.py), a short
per-rank summary, a JSON record under the run's `hang/` folder, then the job is ended with 79 — at a deadline
whatever that thread does. A fatal GPU fault is printed at once and ends the job with 76; an application Xid is
only printed. Rules and sources: docs/watch.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard import console
from podguard.errors import ExitCode
from podguard.launch.spec import JobOutcome
from podguard.launch.watch.board import PlacedBoard, place_board, read_placed, read_placed_slots, remove_board
from podguard.launch.watch.evidence import (
    HANG_END_S,
    LOOP_WRITE_S,
    HangEvidence,
    evidence_deadline_s,
    hang_grace_s,
    write_json,
)
from podguard.launch.watch.filters import PipelineFilters
from podguard.launch.watch.flight import flight_recorder_env, installed_torch_version
from podguard.launch.watch.gpu_faults import POLL_INTERVAL_S, open_gpu_fault_watch
from podguard.launch.watch.gpu_poller import NVML_STALL_S, GpuPoller
from podguard.launch.watch.hangs import Hang, ProgressWatch
from podguard.launch.watch.quiet_ranks import QuietRanks
from podguard.launch.watch.stragglers import StepRates
from podguard.procfs import read_stat
from podguard.rank.progress import ENV_FILE, Beat

if TYPE_CHECKING:
    from podguard.gpu.backend import GpuBackend
    from podguard.launch.multinode.share import ProgressShare
    from podguard.launch.multinode.verdicts import GateSettings
    from podguard.launch.supervisor import Supervisor
    from podguard.launch.watch.gpu_faults import GpuFault, GpuFaultWatch

__all__ = ["RuntimeSettings", "RuntimeWatch"]

TICK_S = 1.0
GPU_WAIT_S = 0.5  # at a worker's end and at the end: how long the loop waits for a fresh NVML poll


@dataclass(frozen=True)
class RuntimeSettings:
    hang_timeout_s: float | None = None
    progress: re.Pattern[str] | None = None
    slow_ratio: float = 0.8
    gpus: tuple[tuple[int, str | None], ...] = ()  # the selected GPUs, (NVML index, UUID); () = CPU only
    slot_gpus: Mapping[int, int] = field(default_factory=dict)  # heartbeat slot (local rank) -> NVML index
    python: str | None = None  # the job's interpreter, where its command names one (its torch arms the recorder)
    line_prefix: re.Pattern[str] | None = None  # a launcher's prefix on the workers' lines (torchrun: `rank3: `)
    line_rank: re.Pattern[str] | None = None  # ... and the rank it names (group `rank`): whose line it is
    tick_s: float = TICK_S
    cluster: GateSettings | None = None  # a multi-node run: where the nodes share their progress (node 0's store)
    hang_end_s: float = field(default_factory=lambda: _env_seconds("PODGUARD_HANG_END_S", HANG_END_S))
    nvml_stall_s: float = field(default_factory=lambda: _env_seconds("PODGUARD_NVML_STALL_S", NVML_STALL_S))


class RuntimeWatch:
    """See the module docstring. `gpu_watch` replaces the NVML fault watch (tests). Its lines go to the console
    (the supervisor's terminal while it runs, stderr before and after)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        run_dir: Path,
        *,
        gpu_watch: GpuFaultWatch | None = None,
    ) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.board: Path | None = None  # the heartbeat board (launch/watch/board.py), once placed
        self._placed: PlacedBoard | None = None
        self.evidence_dir = run_dir / "hang"
        self._gpu_watch = gpu_watch
        self._gpu_watch_tried = False
        self.sup: Supervisor | None = None
        self.progress = self._progress_watch()
        self.rates = StepRates(settings.slow_ratio)
        self.hang: Hang | None = None
        self.hang_lines: list[str] = []
        self.faults: list[GpuFault] = []
        self._timer: Any = None
        self._evidence: HangEvidence | None = None
        self._deadline: Any = None  # the timer that ends a hung job whatever the evidence thread does
        self._hang_ended = False
        self._hang_at = 0.0  # when the hang was found (time.monotonic())
        self._closed = False
        self.flight = False  # torch's flight recorder was armed for this attempt
        self.job_env: dict[str, str] = dict(os.environ)
        self.worker_gpus: dict[str, tuple[int, ...]] = {}
        self.beats: dict[int, Beat] = {}  # the heartbeat board as last read (the metrics read it)
        st = settings
        self.quiet = QuietRanks(st.hang_timeout_s, st.progress, st.line_rank, dict(st.slot_gpus))  # the per-rank rule
        self._filters = PipelineFilters() if st.hang_timeout_s and st.progress is None else None  # (filters.py)
        self.gpu_reader: Callable[[GpuBackend], None] | None = None  # called after each fault poll (metrics/)
        self._poller: GpuPoller | None = None  # the GPU fault watch's thread (NVML never on the loop)
        self._share: ProgressShare | None = None  # multi-node: the other nodes' progress (its own thread)
        self.nvml_stuck = ""  # set once an NVML call stayed in flight for nvml_stall_s

    def _progress_watch(self) -> ProgressWatch:
        st = self.settings
        return ProgressWatch(st.hang_timeout_s, st.progress, time.monotonic(), strip=st.line_prefix)

    # -- before the launch --------------------------------------------------------------------------------
    def worker_env(self, slots: int) -> dict[str, str]:
        """What every worker gets: the heartbeat board, and (with a hang timeout) torch's flight recorder."""
        with contextlib.suppress(OSError):  # a full or read-only state dir: warnings below, never a traceback
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self._open_gpu_watch()  # before the workers: a fault from now on is a fault, not the starting value
        if self._placed is None:
            self._placed = place_board(f"{self.run_dir.name}-{os.getpid()}", max(1, slots), (self.run_dir,))
            atexit.register(remove_board, self._placed)  # also when the attempt fails before the supervisor runs
            for warning in self._placed.warnings:
                console.warn(warning)
        self.board = self._placed.path
        env = {ENV_FILE: str(self.board)} if self.board is not None else {}
        if self.settings.hang_timeout_s is not None:
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
        sup.printer.watch_activity(self._activity)
        self._open_gpu_watch()
        if self.settings.cluster is not None and self._share is None:  # a hang is the job's verdict, not a node's
            from podguard.launch.multinode.share import share_or_none  # noqa: PLC0415  lazy: multi-node runs only

            self._share = share_or_none(self.settings.cluster, lambda: self.progress.events)
        if self._gpu_watch is not None and self._poller is None:  # NVML off the loop: its own thread
            self._poller = GpuPoller(
                self._gpu_watch, min(self.settings.tick_s, POLL_INTERVAL_S), after_poll=self._after_gpu_poll,
                on_faults=lambda: self._on_loop(self._poll_faults),
            )  # fmt: skip
            self._poller.start()
        self._schedule()

    def _open_gpu_watch(self) -> None:
        if self._gpu_watch is None and self.settings.gpus and not self._gpu_watch_tried:
            self._gpu_watch_tried = True
            self._gpu_watch = open_gpu_fault_watch(self.settings.gpus)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._share is not None:
            self._share.close()
        self._poll_faults(final=True)  # a fault that came with the workers' deaths is their root cause
        if self._poller is not None:
            self._poller.close(GPU_WAIT_S)  # (an NVML call that never returns is left to its daemon thread)
        elif self._gpu_watch is not None:
            self._gpu_watch.close()
        if self._evidence is not None:  # bounded: past the deadline the thread is given up (a daemon)
            self._evidence.join(1.0 if self._evidence.done else 0.1)
        if self._placed is not None:
            self.beats = read_placed(self._placed)  # the last beats (after the last tick): the metrics' final values
            remove_board(self._placed)
        write_json(self.run_dir / "watch.json", self.record(), wait_s=4 * LOOP_WRITE_S)  # hang, faults, stragglers

    # -- the loop -------------------------------------------------------------------------------------------
    def _schedule(self) -> None:
        assert self.sup is not None
        self._timer = self.sup.call_later(self.settings.tick_s, self._tick)

    def _line(self, worker: str, line: str) -> None:
        self.progress.line(worker, line, time.monotonic(), rank=self.quiet.line_rank(self.sup, worker, line))

    def _activity(self, worker: str) -> None:
        self.progress.activity(worker, time.monotonic())

    def _tick(self) -> None:
        sup = self.sup
        assert sup is not None
        now = time.monotonic()
        board, busy = read_placed_slots(self._placed)
        self.beats = board
        for slot in self.progress.beats(board, now):
            beat = board[slot]
            if beat.step is not None:
                self.rates.observe(slot, beat.step, beat.at)
        self.progress.busy(busy, now)
        self.quiet.sample(self.progress, now)
        if self._filters is not None and now - self.progress.last_at >= (self.settings.hang_timeout_s or 0) / 2:
            for worker, note in self._filters.sample_supervisor(sup):  # a filter holding the job's lines reads on
                self.progress.activity(worker, now)
                if note:
                    console.say(note)
        for slow in self.rates.check(now):
            console.warn(f"{self._rank(slow.slot)} {slow.text.removeprefix(f'rank {slow.slot} ')}")
        self._poll_faults()
        self._check_nvml_answers()
        if self._share is not None and (seen := self._share.remote()) is not None:
            self.progress.remote(*seen)  # another node moved: the job is not hung
        if self.hang is None and not sup.stopping and (hang := self.progress.check(now, alive=_pid_alive)) is not None:
            if hang.job:
                self._on_hang(hang)
            else:  # these ranks stopped while the job moves on: do they wait for the others? (quiet_ranks.py)
                self.quiet.judge(
                    hang, self.progress, now, on_loop=self._on_loop, hung=self._on_hang,
                    still=lambda: self.progress.check(time.monotonic(), alive=_pid_alive),
                )  # fmt: skip
        if not self._closed:
            self._schedule()

    def hold_clock(self, max_s: float) -> None:
        """podguard waits for a save it asked for (--save-signal): the hang clock stands still, at most `max_s`."""
        self.progress.hold(time.monotonic(), max_s)

    def release_clock(self) -> None:
        self.progress.release(time.monotonic())

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
        if self._poller is None:  # the supervisor never started: nothing else runs, poll here
            faults = self._gpu_watch.poll()
        else:  # a fresh poll waited for briefly at a worker's end and at the end, else what the thread found
            faults = self._poller.poll_now(GPU_WAIT_S) if final or ending else self._poller.take()
        for fault in faults:
            self.faults.append(fault)
            self._write_faults()
            if self.sup is None or final:
                console.say(f"{'GPU FAULT' if fault.fatal else 'GPU event'}: {fault.text}", loud=fault.fatal)
                continue
            if not fault.fatal:
                console.say(f"GPU event ({_kind_of(fault)}, not acted on): {fault.text}")
            elif not self.sup.stopping and not ending:
                self.sup.fail(None, ExitCode.GPU_UNHEALTHY, f"GPU FAULT: {fault.text}: ending the job")
            else:
                console.say(f"GPU FAULT: {fault.text}", loud=True)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """`fn` on the supervisor's loop, from a helper thread (dropped once the watch is closed)."""
        sup = self.sup
        if sup is not None and not self._closed:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                sup.call_from_thread(lambda: None if self._closed else fn())

    def _after_gpu_poll(self, watch: GpuFaultWatch) -> None:
        """On the poller's thread: the metrics' GPU gauges, through the same NVML session."""
        if self.gpu_reader is not None:
            self.gpu_reader(watch.backend)

    def _check_nvml_answers(self) -> None:
        """An NVML call in flight for `nvml_stall_s` is a finding: the GPU (or its driver) is not answering."""
        stuck = self._poller.stuck_s() if self._poller is not None else None
        if stuck is None or stuck < self.settings.nvml_stall_s or self.nvml_stuck or self.sup is None:
            return
        self.nvml_stuck = (
            f"NVML has not answered for {stuck:.0f} s: a GPU or its driver is not responding "
            "(an Xid 79 or a GSP timeout does this); the GPU fault watch waits, the job goes on"
        )
        console.say(f"GPU watch: {self.nvml_stuck}")

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
        write_json(self.run_dir / "gpu_faults.json", record, wait_s=LOOP_WRITE_S)  # (on the loop: bounded)

    # -- hangs ----------------------------------------------------------------------------------------------
    def _on_hang(self, hang: Hang) -> None:
        """Keep the evidence on a helper thread; end the job when it is kept, or at the deadline whatever it does."""
        sup = self.sup
        if sup is None or self.hang is not None or sup.stopping:
            return
        self.hang = hang
        self._hang_at = time.monotonic()
        console.say(f"HUNG: {hang.text}; keeping the evidence in {self.evidence_dir}", loud=True)
        pids = {name: w.pid for name, w in sup.workers.items() if w.alive}
        self.worker_gpus = {name: tuple(w.spec.gpus) for name, w in sup.workers.items()}
        evidence = HangEvidence(
            hang, self.evidence_dir, pids, self.worker_gpus, self.settings.slot_gpus,
            flight=self.flight, job_env=self.job_env,
        )  # fmt: skip
        self._evidence = evidence
        wait_s = evidence_deadline_s(self.settings.hang_end_s, self.settings.tick_s, sup.grace_s)
        self._deadline = sup.call_later(
            wait_s, lambda: self._end_hung(hang, evidence.lines() if evidence.done else evidence.unfinished(wait_s))
        )
        evidence.start(on_done=lambda lines: self._from_thread(lambda: self._end_hung(hang, lines)))

    def _from_thread(self, fn: Callable[[], None]) -> None:
        """The evidence thread's result, onto the loop (once the loop is gone, it is too late: dropped)."""
        sup = self.sup
        if sup is not None and not self._hang_ended:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                sup.call_from_thread(fn)

    def _end_hung(self, hang: Hang, lines: Sequence[str]) -> None:
        """On the loop, once: the summary, then 79 (from the evidence thread, or the deadline if it comes first)."""
        sup = self.sup
        if sup is None or self._hang_ended:
            return
        self._hang_ended = True
        if self._deadline is not None:
            self._deadline.cancel()
        self.hang_lines = list(lines)
        for line in lines:
            console.say(line, loud=True)
        who = f" (rank(s) {', '.join(map(str, hang.ranks))})" if hang.ranks else ""
        st = self.settings
        grace = hang_grace_s(st.hang_end_s, st.tick_s, self._hang_at, time.monotonic())
        sup.fail(None, ExitCode.HUNG, f"job hung{who}", grace_s=grace)  # (the HUNG line above said why)

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
            detail = f"{detail}; {self.stragglers_text()}"
        if code == outcome.exit_code and detail == outcome.detail:
            return outcome
        return replace(outcome, exit_code=int(code), detail=detail)

    def stragglers_text(self) -> str:
        """One short fragment for the END line: 'stragglers: rank 2 (GPU 2) x3 (worst 0.41 of the median)'."""
        named = sorted(self.rates.named.values(), key=lambda r: r.worst.share)
        parts = [f"{self._rank(r.slot)} x{r.count} (worst {r.worst.share:.2f} of the median)" for r in named[:3]]
        more = f" and {len(named) - 3} more" if len(named) > 3 else ""
        return f"stragglers: {', '.join(parts)}{more}"

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
                for s in self.rates.named.values()
            ],
            "progressed": self.progress.progressed,
            "nvml_not_answering": self.nvml_stuck or None,
        }


def _env_seconds(name: str, default: float) -> float:
    """A test knob in seconds (documented in docs/watch.md); the default where unset or not a positive number."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def _pid_alive(pid: int) -> bool:
    """A rank's process still runs (not gone, not a zombie); an unknown pid (0) counts as alive."""
    if pid <= 0:
        return True

    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


def _kind_of(fault: GpuFault) -> str:
    """How a non-fatal fault is labelled: an application Xid is the job's own doing; others are only noted."""
    return "application-level" if fault.application else "not fatal to the job"

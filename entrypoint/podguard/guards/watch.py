"""The guards' state: when each fires, checked on the supervisor's loop during the job and in the idle wait after it.

    guards = open_guards(settings)               # None when no guard is set; reads the pod's budget once
    guards.watch_gpus(selection.indices)         # what the idle guard samples ([] = CPU only: one warning)
    run_job(specs, watch=guards.supervised())    # timers on the supervisor's loop; a trip ends the job (124)
    guards.tripped                               # the Trip that fired, or None

`--max-runtime` and `--max-cost` are deadlines (a timer each, no polling: the cost per hour is known once);
only `--idle-stop` samples, every PODGUARD_GUARD_INTERVAL seconds (default 10), one NVML call per GPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from podguard import console
from podguard.durations import format_duration
from podguard.errors import ExitCode
from podguard.gpu.backend import NvmlUnavailable
from podguard.gpu.factory import open_backend
from podguard.guards.sampler import IdleTracker, UtilizationSampler
from podguard.guards.settings import IDLE_UTILIZATION_PCT, GuardSettings
from podguard.pods import thispod
from podguard.pods.thispod.meter import Budget, read_budget

if TYPE_CHECKING:
    from podguard.gpu.backend import GpuBackend
    from podguard.guards.save import SaveBeforeStop
    from podguard.launch.loop import Timer
    from podguard.launch.supervisor import Supervisor

__all__ = ["GuardWatch", "Phase", "SupervisedGuards", "Trip", "open_guards"]

COST_SLACK_USD = 1e-9  # float rounding at the computed deadline


@dataclass(frozen=True)
class Trip:
    """A guard that fired: which one and the numbers behind it."""

    guard: str  # the option: --idle-stop, --max-runtime, --max-cost
    detail: str
    saved: str = ""  # with --save-signal: whether the job saved before it was ended (guards/save.py)

    @property
    def message(self) -> str:
        return f"billing guard {self.guard}: {self.detail}" + (f"; {self.saved}" if self.saved else "")


class Phase(StrEnum):
    JOB = "job"  # the job runs: all three guards
    AFTER = "after"  # --on-exit idle after the job: idle and cost (the job's runtime is over)


class GuardWatch:
    def __init__(self, settings: GuardSettings, budget: Budget | None) -> None:
        self.settings = settings
        self.budget = budget
        self.phase: Phase | None = None
        self.job_started: float | None = None
        self.tripped: Trip | None = None
        self.samples = 0  # NVML rounds taken (the benchmark reads it)
        self.gpus_chosen = False  # watch_gpus() was called
        self._backend: GpuBackend | None = None
        self._sampler: UtilizationSampler | None = None
        self._tracker = IdleTracker()
        self._warned: set[str] = set()

    # -- what the idle guard watches ---------------------------------------------------------------------
    def watch_gpus(self, indices: Sequence[int] | None) -> None:
        """The GPUs whose idleness counts: the job's selection, or None for every GPU of the node (after a job
        that did not run here, e.g. skipped after a container restart). [] is a CPU-only run."""
        self.gpus_chosen = True
        if self.settings.idle_stop_s is None:
            return
        backend = self._open_backend() if indices is None or indices else None
        if backend is not None and indices is None:
            indices = range(backend.device_count())
        if backend is None or not indices:
            self._sampler = None
            self._warn_once("cpu", "--idle-stop is ignored: this run has no GPU to watch (CPU only)")
            return
        self._sampler = UtilizationSampler(backend, list(indices))

    def _open_backend(self) -> GpuBackend | None:
        if self._backend is None:
            try:
                self._backend = open_backend()
            except NvmlUnavailable as exc:
                self._warn_once("nvml", f"--idle-stop cannot read the GPUs ({exc.message}); it is off")
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        self._sampler = None

    # -- the checks ---------------------------------------------------------------------------------------
    def begin(self, phase: Phase, now: float) -> None:
        self.phase = phase
        if phase is Phase.JOB:
            self.job_started = now
        self._tracker.reset()

    def check(self, now: float) -> Trip | None:
        """The first guard due at `now` (remembered in `tripped`), sampling the GPUs when the idle guard is on."""
        if self.tripped is None:
            self.tripped = self._runtime(now) or self._cost(now) or self._idle(now)
        return self.tripped

    def next_delay(self, now: float) -> float | None:
        """Seconds until the next check is worth making; None when nothing is left to watch."""
        due = [d for d in (self._runtime_deadline(), self._cost_deadline()) if d is not None]
        delay = max(0.0, min(due) - now) if due else None
        if self._sampler is not None:
            delay = min(self.settings.interval_s, delay if delay is not None else float("inf"))
        return delay

    def _runtime_deadline(self) -> float | None:
        limit = self.settings.max_runtime_s
        if limit is None or self.phase is not Phase.JOB or self.job_started is None:
            return None
        return self.job_started + limit

    def _cost_deadline(self) -> float | None:
        if self.budget is None or self.settings.max_cost_usd is None:
            return None
        return self.budget.reached_at(self.settings.max_cost_usd)

    def _runtime(self, now: float) -> Trip | None:
        deadline = self._runtime_deadline()
        if deadline is None or now < deadline or self.job_started is None:
            return None
        limit = self.settings.max_runtime_s or 0.0
        return Trip(
            "--max-runtime",
            f"the job has run {format_duration(now - self.job_started)} (limit {format_duration(limit)})",
        )

    def _cost(self, now: float) -> Trip | None:
        limit, budget = self.settings.max_cost_usd, self.budget
        if limit is None or budget is None or budget.spent(now) + COST_SLACK_USD < limit:
            return None
        since = "since its start" if budget.cluster_id is None else "since its first node's start"
        return Trip(
            "--max-cost",
            f"{budget.what} has spent about ${budget.spent(now):.2f} in {format_duration(budget.running_s(now))} "
            f"{since} at ${budget.cost_per_hr:.2f}/hr (limit ${limit:.2f})",
        )

    def _idle(self, now: float) -> Trip | None:
        limit, sampler = self.settings.idle_stop_s, self._sampler
        if limit is None or sampler is None:
            return None
        sample = sampler.sample()
        self.samples += 1
        unknown = [i for i, u in zip(sampler.indices, sample, strict=True) if u is None]
        if unknown:
            gpus = ", ".join(f"GPU{i}" for i in unknown)
            self._warn_once("unknown", f"NVML cannot read the utilisation of {gpus}: --idle-stop counts it as busy")
        idle_for = self._tracker.update(sample, now)
        if idle_for < limit:
            return None
        gpus = ", ".join(f"GPU{i} {u}%" for i, u in zip(sampler.indices, sample, strict=True))
        where = "" if self.phase is Phase.JOB else " after the job"
        return Trip(
            "--idle-stop",
            f"every GPU at or below {IDLE_UTILIZATION_PCT} % utilisation for {format_duration(idle_for)}{where} "
            f"(limit {format_duration(limit)}; now {gpus})",
        )

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            console.warn(text)

    # -- how it is shown and run ----------------------------------------------------------------------------
    def describe(self) -> str:
        """`billing guards: --idle-stop 30m, ...`: the guards that are on; "" when none is (no empty line)."""
        s = self.settings
        parts = []
        if s.idle_stop_s is not None and not (self.gpus_chosen and self._sampler is None):  # (CPU only: ignored)
            parts.append(f"--idle-stop {format_duration(s.idle_stop_s)}")
        if s.max_runtime_s is not None and self.phase is not Phase.AFTER:  # (the job's runtime is over)
            parts.append(f"--max-runtime {format_duration(s.max_runtime_s)}")
        if s.max_cost_usd is not None and self.budget is not None:  # (no budget: off, said when it was read)
            b = self.budget
            spent = f"{b.what}: about ${b.spent(time.monotonic()):.2f} spent so far"
            parts.append(f"--max-cost ${s.max_cost_usd:.2f} ({spent})")
        return "billing guards: " + ", ".join(parts) if parts else ""

    def supervised(self, save: SaveBeforeStop | None = None) -> SupervisedGuards:
        return SupervisedGuards(self, save)


class SupervisedGuards:
    """The guards on a supervisor's loop (its `watch`): a timer per check; a trip is `sup.fail(..., 124)`, which
    ends the whole job the way a failed worker does (SIGTERM to every group, the grace, SIGKILL). With `save`
    (`--save-signal`), the job is first asked to save and given up to the save grace (guards/save.py)."""

    def __init__(self, watch: GuardWatch, save: SaveBeforeStop | None = None) -> None:
        self.watch = watch
        self.save = save
        self._sup: Supervisor | None = None
        self._timer: Timer | None = None

    def start(self, sup: Supervisor) -> None:
        self._sup = sup
        now = time.monotonic()
        self.watch.begin(Phase.JOB, now)
        self._schedule(now)

    def _schedule(self, now: float) -> None:
        delay = self.watch.next_delay(now)
        if delay is not None and self._sup is not None:
            self._timer = self._sup.call_later(delay, self._tick)

    def _tick(self) -> None:
        sup = self._sup
        if sup is None or sup.stopping:  # the job is ending anyway: a guard must not take the blame
            return
        now = time.monotonic()
        trip = self.watch.check(now)
        if trip is not None:
            if self.save is not None and self.save.start(sup, lambda note: self._end(sup, note)):
                sup.end_with(ExitCode.BILLING_GUARD, f"{trip.message} (the job was asked to save)")
                return  # the save request is out: the job ends when it saved or the grace is over
            self._end(sup, self.save.note if self.save is not None else None)
            return
        self._schedule(now)

    def _end(self, sup: Supervisor, note: str | None) -> None:
        trip = self.watch.tripped
        if trip is None:
            return
        if note:
            trip = self.watch.tripped = replace(trip, saved=note)
        sup.fail(None, ExitCode.BILLING_GUARD, trip.message)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.save is not None and self.save.waiting:  # the workers exited (after saving?) before the decision
            self.save.finish()
            if self.watch.tripped is not None and self.save.note:
                self.watch.tripped = replace(self.watch.tripped, saved=self.save.note)
        self._sup = None


def open_guards(settings: GuardSettings) -> GuardWatch | None:
    """The guards, or None when none is set. `--max-cost` reads this pod's cost and start from the API here
    (retried like every API call; a failure is the API's exit code, before anything runs)."""
    if not settings.active:
        return None
    budget = None
    if settings.max_cost_usd is not None:
        budget = read_budget(thispod.pod_id())
    return GuardWatch(settings, budget)

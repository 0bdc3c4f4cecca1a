"""Stop what holds the selected GPUs, safely and fast, and wait until their memory is back and stays back.

    plan = plan_cleanup(backend, [0], dev_dir="/dev")
    result = execute_cleanup(plan, backend, grace_s=7, busy_timeout_s=60)   # its progress: console lines
    result.ok, result.killed, result.recommendations

`execute_cleanup` builds a `CleanupRun` (fields instead of closures, one method per phase, a `Phase`
enum) and runs it: stop rounds until no planned target is left -> wait for idle, rescanning for
respawns -> a quiet period in which neither NVML nor the device files show a new holder -> result.
The full rules: docs/cleanup.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from podguard import console
from podguard.gpu.backend import GpuBackend
from podguard.preflight.cleanup.advice import HEAL_ADVICE, gpus_text, memory_text, recommend, starters_still_running
from podguard.preflight.cleanup.evidence import short
from podguard.preflight.cleanup.idle import (
    BACKOFF_CAP_S,
    BACKOFF_START_S,
    IdleWatch,
    Throttle,
    wait_for_idle,
)
from podguard.preflight.cleanup.planner import plan_cleanup, replan
from podguard.preflight.cleanup.policy import Policy
from podguard.preflight.cleanup.process_table import ProcessTable, scan_processes, ticks_now
from podguard.preflight.cleanup.stopround import StopRound
from podguard.preflight.cleanup.vocabulary import (
    CleanupPlan,
    CleanupResult,
    ForeignProcess,
    GpuIdleState,
    GpuState,
    KillRecord,
    Respawner,
    Role,
    SkipCode,
    Skipped,
)

__all__ = ["CleanupRun", "CleanupSettings", "Phase", "cleanup", "execute_cleanup", "plan_cleanup", "wait_for_idle"]

log = logging.getLogger("podguard.cleanup")

RESCAN_START_S = 0.05
RESCAN_CAP_S = 1.0
QUIET_S = 0.5  # after a kill, this long with no holder in NVML nor in the device files before "done"


class Phase(StrEnum):
    PLANNED = "planned"
    STOPPING = "stopping"
    WAITING = "waiting"  # for memory to come back, and then for the quiet period
    DONE = "done"


@dataclass(frozen=True)
class CleanupSettings:
    grace_s: float = 7.0
    busy_timeout_s: float = 60.0  # the wait for memory, counted from the start of the cleanup
    idle_memory_mib: int = 512
    dry_run: bool = False
    kill_timeout_s: float = 5.0
    max_rounds: int = 3
    quiet_s: float = QUIET_S


class CleanupRun:
    """One cleanup, carried out; the state that the phases share lives in fields."""

    def __init__(
        self,
        plan: CleanupPlan,
        backend: GpuBackend,
        settings: CleanupSettings,
    ) -> None:
        self.plan = plan
        self.config = plan.config
        self.backend = backend
        self.settings = settings
        self.phase = Phase.PLANNED
        self.started = time.monotonic()
        self.started_ticks = ticks_now() - 1  # processes started after this are new: respawns, not bystanders
        self.deadline = self.started + max(0.0, settings.busy_timeout_s)
        self.skipped: dict[tuple[int, str], Skipped] = {(s.pid, s.code): s for s in plan.skipped}
        self.foreign: dict[tuple[int, int], ForeignProcess] = {(f.pid, f.gpu): f for f in plan.foreign}
        self.actions: list[KillRecord] = []
        self.done: set[tuple[int, int]] = set()  # (pid, start time) of every target handled
        self.rounds = 0
        self.timings = {"scan": plan.scan_ms, "plan": plan.plan_ms, "stop": 0.0, "rescan": 0.0}
        self.last_exit: float | None = None
        self.parents: dict[tuple[int, int], list[int]] = {}  # parents of stopped processes -> those children
        self.stopped_commands: dict[tuple[int, int], set[str]] = {}  # same parents -> the children's commands
        self.respawners: dict[int, int] = {}  # proven respawners: pid -> start time (roots of later rounds)
        self.respawn_records: dict[int, Respawner] = {}
        self.contenders: dict[int, list[int]] = {}  # GPU -> pids a watched parent started that hold it
        self.watch = IdleWatch(backend, self.config.gpus, idle_memory_mib=settings.idle_memory_mib, mig=self.config.mig)
        self.rescan_every = RESCAN_START_S
        self.next_rescan = self.started + RESCAN_START_S

    # -- the run -------------------------------------------------------------------------------------

    def run(self) -> CleanupResult:
        if self.settings.dry_run:
            return self._dry_run()
        self.phase = Phase.STOPPING
        current = self.plan
        while self._round(current):
            current = self._rescan()
        self.phase = Phase.WAITING
        self._wait()
        self.phase = Phase.DONE
        return self._result()

    def _dry_run(self) -> CleanupResult:
        for t in self.plan.targets:
            log.info(
                "dry run: would SIGTERM pid %d [%s] on %s (%s): %s | %s",
                t.pid,
                t.role.value,
                gpus_text(t.gpus),
                memory_text(t),
                t.reason,
                t.cmdline,
            )
        t0 = time.monotonic()
        self.watch.poll()
        states = self.watch.states(self.config)
        self.timings["wait_idle"] = (time.monotonic() - t0) * 1000.0
        self.timings["total"] = self.plan.plan_ms + (time.monotonic() - self.started) * 1000.0
        recs = recommend(self.plan, (), self.plan.skipped, states)
        if self.plan.targets:
            recs.insert(0, f"dry run: {len(self.plan.targets)} process(es) would be stopped; run without --dry-run")
        return CleanupResult(
            True,
            self.config.gpus,
            self.plan,
            (),
            self.plan.skipped,
            self.plan.foreign,
            states,
            0,
            self.timings,
            tuple(recs),
        )

    # -- stopping ------------------------------------------------------------------------------------

    def _round(self, current: CleanupPlan) -> bool:
        """Stop the not-yet-handled targets of `current`; False when there was nothing (more) to do."""
        fresh = [t for t in current.targets if (t.pid, t.start_time) not in self.done]
        if not fresh:
            return False
        if self.rounds >= self.settings.max_rounds:
            for t in fresh:
                reason = f"appeared again after {self.settings.max_rounds} cleanup rounds: left running ({t.reason})"
                self.skipped.setdefault(
                    (t.pid, SkipCode.RESPAWN_LIMIT), Skipped(t.pid, t.cmdline, SkipCode.RESPAWN_LIMIT, reason, t.gpus)
                )
                self.done.add((t.pid, t.start_time))
            return False
        self.rounds += 1
        gpus = sorted({g for t in fresh for g in t.gpus})
        console.say(
            f"stopping {len(fresh)} process(es) in {len({t.tree for t in fresh})} job tree(s) holding "
            f"{gpus_text(gpus)} (round {self.rounds})"
        )
        t0 = time.monotonic()
        procs = StopRound(
            fresh,
            self.config,
            self.rounds,
            grace_s=self.settings.grace_s,
            kill_timeout_s=self.settings.kill_timeout_s,
        ).run()
        self.timings["stop"] += (time.monotonic() - t0) * 1000.0
        targeted = {p.pid for p in procs}
        for p in procs:
            self.done.add((p.pid, p.target.start_time))
            record = p.record()
            self.actions.append(record)
            if p.exited_at is not None:
                self.last_exit = p.exited_at if self.last_exit is None else max(self.last_exit, p.exited_at)
            if record.stopped and p.target.parent not in targeted:
                key = (p.target.parent, p.target.parent_start)
                self.parents.setdefault(key, []).append(p.pid)
                self.stopped_commands.setdefault(key, set()).add(p.target.cmdline)
            if p.target.role is Role.RESPAWNER and p.pid in self.respawn_records and record.stopped:
                r = self.respawn_records[p.pid]
                self.respawn_records[p.pid] = Respawner(r.pid, r.cmdline, r.children, r.gpus, True, "")
        return True

    def _rescan(self) -> CleanupPlan:
        """Plan again; a watched parent seen starting a new holder becomes a respawner (the next root)."""
        t0 = time.monotonic()
        table = scan_processes(self.config.dev_dir)
        current = replan(self.config, self.backend, table=table, respawners=self.respawners)
        if self._find_respawners(current, table):
            current = replan(self.config, self.backend, table=table, respawners=self.respawners)
        self.timings["rescan"] += (time.monotonic() - t0) * 1000.0
        for s in current.skipped:
            self.skipped.setdefault((s.pid, s.code), s)
        for f in current.foreign:
            self.foreign.setdefault((f.pid, f.gpu), f)
        self._find_contenders(table)
        return current

    def _find_respawners(self, current: CleanupPlan, table: ProcessTable) -> bool:
        """Record each watched parent that started a new NVML-listed holder of a selected GPU; True when
        one that may be stopped was found (so that the plan roots the next round at it)."""
        found = False
        selected = set(self.config.gpus)
        policy: Policy | None = None
        for h in current.holders:
            parent = table.get(h.ppid)
            if parent is None or (h.pid, h.start_time) in self.done or not selected.intersection(h.gpus):
                continue
            if h.start_time < self.started_ticks:
                continue  # it was there before the cleanup began: a bystander of the parent, not a respawn
            key = (parent.pid, parent.start_time)
            if key not in self.parents or parent.pid in self.respawners:
                continue
            policy = policy or Policy(table, self.config)
            excluded = policy.excluded(parent)
            why = (
                excluded[1]
                if excluded
                else ("an interactive shell (somebody's terminal)" if parent.interactive_shell else "")
            )
            prev = self.respawn_records.get(parent.pid)
            children = tuple(dict.fromkeys([*(prev.children if prev else ()), h.pid]))
            gpus = tuple(sorted(set(prev.gpus if prev else ()) | set(h.gpus)))
            self.respawn_records[parent.pid] = Respawner(
                parent.pid, parent.safe_command[:160], children, gpus, False, why
            )
            if not why:
                self.respawners[parent.pid] = parent.start_time
                found = True
                console.warn(
                    f"pid {parent.pid} ({parent.safe_command[:120]}) started holder {h.pid} again after its "
                    "previous child was stopped: it is the root of the next round"
                )
        return found

    def _find_contenders(self, table: ProcessTable) -> None:
        """New processes a watched parent started that may be a respawn NVML does not list yet: those with a
        selected GPU's device file open, and those running the very command that was just stopped (a
        respawned `python train.py` still importing torch). While there are any, the cleanup is not quiet."""
        self.contenders = {}
        watched = set(self.parents) | set(self.respawners.items())
        if not watched:
            return
        minors = {self.config.minors.get(g, g): g for g in self.config.gpus}
        for p in table:
            parent = table.get(p.ppid)
            if parent is None or (parent.pid, parent.start_time) not in watched:
                continue
            if p.start_time < self.started_ticks or (p.pid, p.start_time) in self.done or p.zombie:
                continue
            gpus = [minors[m] for m in p.gpu_minors if m in minors]
            again = short(p.safe_command) in self.stopped_commands.get((parent.pid, parent.start_time), ())
            for gpu in gpus or (list(self.config.gpus) if again else []):
                self.contenders.setdefault(gpu, []).append(p.pid)

    # -- waiting -------------------------------------------------------------------------------------

    def _wait(self) -> None:
        """Poll until every GPU is idle and has stayed quiet for `quiet_s` (only after a kill), or the
        deadline passes; look for respawns now and then while busy and on every poll while quiet."""
        t_wait = time.monotonic()
        notes = Throttle()
        delay = BACKOFF_START_S
        quiet_since: float | None = None
        while True:
            idle = self.watch.poll()
            now = time.monotonic()
            acted = False
            if self.rounds and (idle or now >= self.next_rescan):
                acted = self._rescan_and_stop(now)
            if idle and not acted and not self.contenders:
                quiet_since = quiet_since or now
                if not self.rounds or now - quiet_since >= self.settings.quiet_s:
                    break
            else:
                quiet_since = None
            end = self.deadline + (self.settings.quiet_s if quiet_since is not None else 0.0)
            if now >= end or (self.watch.hopeless and not acted):
                break
            if not idle and notes.due(now):
                console.say(self.watch.note(self.deadline))
            delay = BACKOFF_START_S if (self.watch.progressed or acted) else delay
            time.sleep(max(0.0, min(delay, end - time.monotonic())))
            delay = min(delay * 2, BACKOFF_CAP_S)
        self.timings["wait_idle"] = (time.monotonic() - t_wait) * 1000.0

    def _rescan_and_stop(self, now: float) -> bool:
        self.rescan_every = min(self.rescan_every * 2, RESCAN_CAP_S)
        self.next_rescan = now + self.rescan_every
        acted = False
        while self._round(self._rescan()):
            acted = True
        return acted

    # -- the result ----------------------------------------------------------------------------------

    def _result(self) -> CleanupResult:
        states = self.watch.states(self.config)
        for gpu, pids in self.contenders.items():  # NVML idle, but a respawned process holds the device file
            s = states.get(gpu)
            if s is not None and s.idle:
                who = ", ".join(map(str, pids))
                detail = f"process(es) {who} started again by a stopped job's parent hold its device file"
                states[gpu] = GpuIdleState(
                    gpu, GpuState.BUSY, s.memory_used, s.processes, tuple(pids), detail, s.waited_ms
                )
        t_end = time.monotonic()
        self.timings["total"] = self.plan.plan_ms + (t_end - self.started) * 1000.0
        if self.last_exit is not None and states and all(s.idle for s in states.values()):
            idle_at = max(self.watch.idle_since.get(i, t_end) for i in states)
            self.timings["release_after_last_exit"] = max(0.0, (idle_at - self.last_exit) * 1000.0)
        for s in states.values():
            if s.state is GpuState.PHANTOM:
                console.warn(f"GPU{s.index}: {s.detail}; {HEAL_ADVICE}")
            elif s.state in (GpuState.BUSY, GpuState.UNKNOWN):
                console.warn(f"GPU{s.index} still {s.state.value}: {s.detail}")
        skipped = tuple(sorted(self.skipped.values(), key=lambda s: (s.pid, s.code)))
        respawners = tuple(self.respawn_records[k] for k in sorted(self.respawn_records))
        recs = recommend(self.plan, self.actions, skipped, states, respawners)
        recs.extend(starters_still_running(self.actions, self.config))
        return CleanupResult(
            False,
            self.config.gpus,
            self.plan,
            tuple(self.actions),
            skipped,
            tuple(self.foreign.values()),
            states,
            self.rounds,
            self.timings,
            tuple(dict.fromkeys(recs)),
            respawners,
        )


def execute_cleanup(
    plan: CleanupPlan,
    backend: GpuBackend,
    *,
    grace_s: float = 7.0,
    busy_timeout_s: float = 60.0,
    idle_memory_mib: int = 512,
    dry_run: bool = False,
    kill_timeout_s: float = 5.0,
    max_rounds: int = 3,
    quiet_s: float = QUIET_S,
) -> CleanupResult:
    """Carry out `plan` and wait for the selected GPUs' memory to come back (and stay back).

    `busy_timeout_s` bounds the wait for memory, counted from the start of this call (each kill round is
    bounded by `grace_s` + `kill_timeout_s`, and a quiet period running at the deadline may finish, so
    the call may end past it by that much). `dry_run` signals nothing and returns the plan as `planned`
    with the GPUs' current state from a single poll.
    """
    settings = CleanupSettings(grace_s, busy_timeout_s, idle_memory_mib, dry_run, kill_timeout_s, max_rounds, quiet_s)
    return CleanupRun(plan, backend, settings).run()


def cleanup(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    dev_dir: str | None = None,
    protect: Sequence[str] = (),
    patterns: Sequence[str] = (),
    self_pid: int | None = None,
    **settings: float | int | bool,
) -> CleanupResult:
    """`plan_cleanup` then `execute_cleanup`, for callers that do not need to look at the plan first."""
    plan = plan_cleanup(backend, gpu_indices, dev_dir=dev_dir, protect=protect, patterns=patterns, self_pid=self_pid)
    return execute_cleanup(plan, backend, **settings)  # type: ignore[arg-type]

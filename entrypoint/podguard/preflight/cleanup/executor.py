"""Stop what holds the selected GPUs, safely and fast, and wait until their memory is back.

Why: the seed scripts SIGKILLed by name and by open device file, then slept a fixed time: wrong victims, no
grace for checkpoints, a torchrun agent that respawns the worker just killed, and a blind wait that is
both too long (usually) and too short (sometimes). Here only the job trees planned by
`podguard.preflight.cleanup.planner` are signalled, launcher first, and every wait polls a condition against a deadline.

Public API:

* `plan_cleanup(backend, gpu_indices, *, dev_dir=None, protect=(), patterns=(), self_pid=None, ...)
  -> CleanupPlan` (from `planner`): who holds what, what would be stopped and why.
* `execute_cleanup(plan, backend, *, grace_s=10, busy_timeout_s=60, idle_memory_mib=512,
  dry_run=False, progress=None, kill_timeout_s=5, max_rounds=3) -> CleanupResult`.
* `wait_for_idle(backend, gpu_indices, *, deadline, idle_memory_mib=512, ...) -> dict[int, GpuIdleState]`.
* `cleanup(backend, gpu_indices, **options) -> CleanupResult`: plan + execute in one call.

How a round stops its job trees:

1. Each target is pinned with `pidfd_open` and its start time re-checked, so a PID reused since the
   scan is never signalled (fallback without pidfds: start time checked right before `kill`).
2. Every tree is frozen with SIGSTOP, launcher first; the frozen trees are listed again and processes
   forked meanwhile are frozen and added. A frozen launcher cannot respawn anything.
3. SIGTERM to all (launcher first, then descendants top-down), then SIGCONT: each process wakes with
   SIGTERM pending, so a torchrun agent runs its shutdown instead of noticing a dead worker.
4. Wait up to `grace_s` for exits: `poll()` on the pidfds returns the moment the last one exits (no
   fixed sleep; without pidfds /proc is polled with backoff 5 ms -> 100 ms). Exit is "became a
   zombie or disappeared": a zombie has released its files and GPU memory. Processes are not reaped
   here (their parent, e.g. a `Popen` owner, keeps its exit status).
5. Survivors are frozen and re-listed again, then SIGKILLed (launcher first); a process still there
   `kill_timeout_s` later is "unkillable" (usually `D` state: stuck in the driver -> restart the pod).

After a round the holders are scanned again with the same plan configuration; a respawn that slipped
through is stopped in another round (at most `max_rounds`; beyond that it is reported as
`respawn_limit`). Rescans continue, with backoff, while waiting for memory. Finally each GPU is
idle (no NVML process and memory_used <= idle_memory_mib), busy (a local holder is left: protected,
unkillable, another user's), or phantom (memory held with no holder visible here: a context from
another PID namespace or a process the driver is still tearing down -> restart the pod).

Every signal is logged on the `podguard.cleanup` logger with pid, command line, GPUs, memory and reason.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from podguard.gpu.backend import GpuBackend, GpuProcess
from podguard.preflight.cleanup.planner import (
    CleanupPlan,
    ForeignProcess,
    PlanConfig,
    Policy,
    Skipped,
    Target,
    describe_memory,
    plan_cleanup,
    replan,
)
from podguard.preflight.cleanup.procfs import ProcessTable, read_stat, resolve_dev_dir, scan_processes
from podguard.units import MIB

__all__ = [
    "CleanupResult",
    "GpuIdleState",
    "GpuState",
    "KillRecord",
    "cleanup",
    "execute_cleanup",
    "plan_cleanup",
    "wait_for_idle",
]

log = logging.getLogger("podguard.cleanup")

Progress = Callable[[str], None]

_BACKOFF_START_S = 0.005
_BACKOFF_CAP_S = 0.100
_PROGRESS_EVERY_S = 1.0
_RESCAN_START_S = 0.05
_RESCAN_CAP_S = 1.0

HEAL_ADVICE = (
    "restart the pod to reset the driver state: `podguard pod heal` (or stop + start the pod on RunPod; "
    "restarting only the container keeps the same driver state)"
)


class GpuState(StrEnum):
    IDLE = "idle"
    BUSY = "busy"  # a local holder is still there (protected, unkillable, another user's, ...)
    PHANTOM = "phantom"  # memory held, no holder visible in this PID namespace
    UNKNOWN = "unknown"  # NVML could not answer (GPU lost, query failed)


@dataclass(frozen=True)
class GpuIdleState:
    """Where one GPU stands at the end of a wait."""

    index: int
    state: GpuState
    memory_used: int | None  # bytes, NVML v2 "used"
    processes: tuple[GpuProcess, ...] = ()  # NVML's list at the end
    holders: tuple[int, ...] = ()  # local pids with its device file open at the end (busy only)
    detail: str = ""
    waited_ms: float = 0.0  # from the start of the wait until idle (or the deadline)

    @property
    def idle(self) -> bool:
        return self.state is GpuState.IDLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state.value,
            "memory_used_mib": None if self.memory_used is None else round(self.memory_used / MIB, 1),
            "processes": [{"pid": p.pid, "used_memory": p.used_memory, "kind": p.kind} for p in self.processes],
            "holders": list(self.holders),
            "detail": self.detail,
            "waited_ms": round(self.waited_ms, 3),
        }


@dataclass(frozen=True)
class KillRecord:
    """What happened to one target.

    `outcome`: "terminated" (exited after SIGTERM), "killed" (needed SIGKILL), "gone" (had exited before
    it was signalled, or its PID was reused), "unkillable" (still there after SIGKILL), "not_permitted"
    (EPERM). `exit_ms` is from its first signal to its exit.
    """

    pid: int
    cmdline: str
    name: str
    role: str
    tree: int
    gpus: tuple[int, ...]
    memory: dict[int, int | None] = field(hash=False)
    reason: str
    round: int
    outcome: str
    signals: tuple[str, ...] = ()
    exit_ms: float | None = None
    state: str | None = None  # /proc state when unkillable
    parent: int = 0  # its parent when planned

    @property
    def stopped(self) -> bool:
        return self.outcome in ("terminated", "killed")

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "cmdline": self.cmdline,
            "name": self.name,
            "role": self.role,
            "tree": self.tree,
            "gpus": list(self.gpus),
            "memory_mib": {str(g): None if m is None else round(m / MIB, 1) for g, m in self.memory.items()},
            "reason": self.reason,
            "round": self.round,
            "outcome": self.outcome,
            "signals": list(self.signals),
            "exit_ms": None if self.exit_ms is None else round(self.exit_ms, 3),
            "state": self.state,
            "parent": self.parent,
        }


@dataclass(frozen=True)
class CleanupResult:
    """Everything a cleanup did and saw; `to_dict()` is what goes into the JSON report."""

    dry_run: bool
    gpus: tuple[int, ...]
    plan: CleanupPlan  # the first plan (in a dry run: exactly what would be done)
    actions: tuple[KillRecord, ...]
    skipped: tuple[Skipped, ...]
    foreign: tuple[ForeignProcess, ...]
    states: dict[int, GpuIdleState] = field(hash=False)
    rounds: int
    timings_ms: dict[str, float] = field(hash=False)
    recommendations: tuple[str, ...] = ()

    @property
    def planned(self) -> tuple[Target, ...]:
        return self.plan.targets

    @property
    def killed(self) -> tuple[KillRecord, ...]:
        return tuple(a for a in self.actions if a.stopped)

    @property
    def unkillable(self) -> tuple[KillRecord, ...]:
        return tuple(a for a in self.actions if a.outcome == "unkillable")

    @property
    def phantom(self) -> dict[int, int | None]:
        """GPU index -> bytes still used with no holder visible here."""
        return {i: s.memory_used for i, s in self.states.items() if s.state is GpuState.PHANTOM}

    @property
    def busy(self) -> tuple[int, ...]:
        return tuple(i for i, s in sorted(self.states.items()) if not s.idle)

    @property
    def ok(self) -> bool:
        return all(s.idle for s in self.states.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "gpus": list(self.gpus),
            "ok": self.ok,
            "planned": [t.to_dict() for t in self.planned],
            "killed": [a.to_dict() for a in self.killed],
            "unkillable": [{**a.to_dict(), "reason": _unkillable_text(a)} for a in self.unkillable],
            "other_actions": [a.to_dict() for a in self.actions if not a.stopped and a.outcome != "unkillable"],
            "skipped": [s.to_dict() for s in self.skipped],
            "foreign": [f.to_dict() for f in self.foreign],
            "phantom_mib": {str(i): None if m is None else round(m / MIB, 1) for i, m in self.phantom.items()},
            "gpu_states": {str(i): s.to_dict() for i, s in sorted(self.states.items())},
            "rounds": self.rounds,
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
            "recommendations": list(self.recommendations),
            "plan": self.plan.to_dict(),
        }


def _unkillable_text(a: KillRecord) -> str:
    if a.state == "D":
        return "stuck in uninterruptible sleep (D state) after SIGKILL, usually inside the GPU driver; " + HEAL_ADVICE
    return f"still present after SIGKILL (state {a.state or '?'}); " + HEAL_ADVICE


# --------------------------------------------------------------------------------------------------
# Signalling one process safely
# --------------------------------------------------------------------------------------------------


class _Handle:
    """A target pinned for signalling: a pidfd where the kernel has them, else (pid, start time)."""

    def __init__(self, target: Target, round_no: int) -> None:
        self.target = target
        self.round = round_no
        self.pidfd: int | None = None
        self.signals: list[str] = []
        self.first_signal_at: float | None = None
        self.exited_at: float | None = None
        self.outcome: str | None = None  # set once final
        self.state: str | None = None

    @property
    def pid(self) -> int:
        return self.target.pid

    @property
    def live(self) -> bool:
        return self.outcome is None and self.exited_at is None

    def open(self) -> None:
        st = read_stat(self.pid)
        if st is None or st.start_time != self.target.start_time:
            self.outcome = "gone"
            return
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.outcome = "gone"
            return
        except (OSError, AttributeError):  # no pidfd support: signal by pid after checking the start time
            if st.state in ("Z", "X"):
                self.outcome = "gone"
            return
        st = read_stat(self.pid)  # the pidfd pins the process; confirm it is still the one planned
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        # Readable = the whole thread group has exited (a "Z" leader with live threads is not gone).
        if st is None or st.start_time != self.target.start_time or poller.poll(0):
            os.close(fd)
            self.outcome = "gone"
            return
        self.pidfd = fd

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def has_exited(self) -> bool:
        """Non-blocking check; pidfd handles are normally settled by poll() instead."""
        st = read_stat(self.pid)
        return st is None or st.start_time != self.target.start_time or st.state in ("Z", "X")

    def mark_exited(self, now: float) -> None:
        if self.exited_at is None:
            self.exited_at = now

    def send(self, sig: signal.Signals, *, record: bool = True) -> bool:
        if not self.live:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                if self.has_exited():
                    self.mark_exited(time.monotonic())
                    return False
                os.kill(self.pid, sig)
        except ProcessLookupError:
            self.mark_exited(time.monotonic())
            return False
        except PermissionError:
            self.outcome = "not_permitted"
            log.warning("not permitted to signal pid %d (%s): %s", self.pid, self.target.cmdline, sig.name)
            return False
        if record:
            self.signals.append(sig.name)
            if self.first_signal_at is None:
                self.first_signal_at = time.monotonic()
        return True

    def record(self) -> KillRecord:
        t = self.target
        outcome = self.outcome
        if outcome is None:
            outcome = "killed" if "SIGKILL" in self.signals else ("terminated" if self.signals else "gone")
        exit_ms = None
        if self.exited_at is not None and self.first_signal_at is not None:
            exit_ms = max(0.0, (self.exited_at - self.first_signal_at) * 1000.0)
        return KillRecord(
            pid=t.pid,
            cmdline=t.cmdline,
            name=t.name,
            role=t.role,
            tree=t.tree,
            gpus=t.gpus,
            memory=dict(t.memory),
            reason=t.reason,
            round=self.round,
            outcome=outcome,
            signals=tuple(self.signals),
            exit_ms=exit_ms,
            state=self.state,
            parent=t.parent,
        )


def _memory_text(t: Target) -> str:
    known = [m for m in t.memory.values() if m is not None]
    if not t.gpus:
        return "no GPU memory of its own"
    return describe_memory(sum(known)) if known else "memory not listed by NVML"


def _gpus_text(gpus: Sequence[int]) -> str:
    return ",".join(f"GPU{g}" for g in gpus) or "-"


def _wait_exits(handles: Sequence[_Handle], deadline: float, progress: Progress | None, what: str) -> None:
    """Block until every live handle has exited or the deadline passes; returns at once when all exit."""
    pending = [h for h in handles if h.live]
    if not pending:
        return
    poller = select.poll()
    by_fd: dict[int, _Handle] = {}
    for h in pending:
        if h.pidfd is not None:
            poller.register(h.pidfd, select.POLLIN)
            by_fd[h.pidfd] = h
    delay = _BACKOFF_START_S
    started = time.monotonic()
    next_note = started + _PROGRESS_EVERY_S
    while pending:
        now = time.monotonic()
        if now >= deadline:
            break
        timeout = deadline - now
        polled = [h for h in pending if h.pidfd is None]
        if polled:
            timeout = min(timeout, delay)
            delay = min(delay * 2, _BACKOFF_CAP_S)
        if progress is not None:
            timeout = min(timeout, max(0.0, next_note - now))
        for fd, _event in poller.poll(max(1, math.ceil(timeout * 1000))):
            by_fd[fd].mark_exited(time.monotonic())
            poller.unregister(fd)
        for h in polled:
            if h.has_exited():
                h.mark_exited(time.monotonic())
        pending = [h for h in pending if h.live]
        now = time.monotonic()
        if progress is not None and pending and now >= next_note:
            progress(f"waiting for {len(pending)} process(es) to exit after {what} ({now - started:.0f}s)")
            next_note = now + _PROGRESS_EVERY_S


def _adopt_new_members(handles: list[_Handle], config: PlanConfig, round_no: int) -> None:
    """List the children of the (frozen) members again; pin, freeze and add those forked since the scan.

    A child forked by a member after our scan would otherwise escape (a launcher respawning its worker
    during the grace period); once every member is stopped nobody can fork, so a few passes reach a
    fixed point. Only live members are looked under (a dead member's pid may already be reused).
    """
    for _pass in range(4):
        table = scan_processes(config.dev_dir, fds=False)
        policy = Policy(table, config)
        known = {(h.pid, h.target.start_time) for h in handles}
        frontier = [(h.pid, h.target.tree) for h in handles if h.live]
        added = 0
        while frontier:
            nxt: list[tuple[int, int]] = []
            for parent, tree in frontier:
                for child in table.children(parent):
                    p = table.procs[child]
                    if p.zombie or (child, p.start_time) in known or policy.excluded(p) is not None:
                        continue
                    target = Target(
                        pid=child,
                        start_time=p.start_time,
                        cmdline=p.command[:160],
                        name=os.path.basename(p.cmdline[0]) if p.cmdline else p.comm,
                        role="member",
                        tree=tree,
                        reason=f"started in the job tree of {tree} (by pid {parent}) while it was being stopped",
                        uid=p.uid,
                        parent=parent,
                    )
                    h = _Handle(target, round_no)
                    h.open()
                    if h.live:
                        h.send(signal.SIGSTOP, record=False)
                        handles.append(h)
                        known.add((child, p.start_time))
                        added += 1
                        nxt.append((child, tree))
            frontier = nxt
        if not added:
            return


def _stop_round(
    targets: Sequence[Target],
    config: PlanConfig,
    round_no: int,
    grace_s: float,
    kill_timeout_s: float,
    progress: Progress | None,
) -> list[_Handle]:
    """Freeze, SIGTERM (launcher first), thaw, wait `grace_s`, SIGKILL survivors, classify leftovers."""
    handles = [_Handle(t, round_no) for t in targets]
    for h in handles:
        h.open()
    frozen: list[_Handle] = []
    try:
        for h in handles:
            if h.send(signal.SIGSTOP, record=False):
                frozen.append(h)
        _adopt_new_members(handles, config, round_no)
        frozen.extend(h for h in handles if h not in frozen and h.live)
        for h in handles:
            t = h.target
            if h.send(signal.SIGTERM):
                log.info(
                    "SIGTERM pid %d [%s] on %s (%s): %s | %s",
                    t.pid,
                    t.role,
                    _gpus_text(t.gpus),
                    _memory_text(t),
                    t.reason,
                    t.cmdline,
                )
    finally:
        for h in frozen:
            h.send(signal.SIGCONT, record=False)
    if progress is not None and any(h.live for h in handles):
        progress(f"sent SIGTERM to {sum(1 for h in handles if h.signals)} process(es); grace {grace_s:g}s")
    _wait_exits(handles, time.monotonic() + grace_s, progress, "SIGTERM")

    survivors = [h for h in handles if h.live]
    if survivors:
        for h in survivors:
            h.send(signal.SIGSTOP, record=False)
        _adopt_new_members(handles, config, round_no)
        survivors = [h for h in handles if h.live]
        for h in survivors:
            t = h.target
            if h.send(signal.SIGKILL):
                log.warning(
                    "SIGKILL pid %d [%s] on %s (%s) after %.3gs grace: %s | %s",
                    t.pid,
                    t.role,
                    _gpus_text(t.gpus),
                    _memory_text(t),
                    grace_s,
                    t.reason,
                    t.cmdline,
                )
        _wait_exits(survivors, time.monotonic() + kill_timeout_s, progress, "SIGKILL")
        for h in survivors:
            if h.live:
                st = read_stat(h.pid)
                h.state = st.state if st is not None else None
                h.outcome = "unkillable"
                log.error(
                    "pid %d (%s) is still there %.3gs after SIGKILL (state %s): unkillable; %s",
                    h.pid,
                    h.target.cmdline,
                    kill_timeout_s,
                    h.state,
                    HEAL_ADVICE,
                )
    for h in handles:
        h.close()
    return handles


# --------------------------------------------------------------------------------------------------
# Waiting for memory to come back
# --------------------------------------------------------------------------------------------------


def _poll_gpu(backend: GpuBackend, index: int, idle_bytes: int) -> tuple[bool, tuple[GpuProcess, ...], int | None]:
    procs = tuple(backend.processes(index))
    used = backend.memory_used(index)
    idle = not procs and (used is None or used <= idle_bytes)
    return idle, procs, used


def _classify(
    index: int,
    procs: tuple[GpuProcess, ...],
    used: int | None,
    table: ProcessTable | None,
    minor: int,
    self_pid: int,
    waited_ms: float,
) -> GpuIdleState:
    """A GPU that is not idle: busy if a local process still holds its device file, else phantom."""
    local: list[int] = []
    notes: list[str] = []
    if table is not None:
        for pid in table.holders_of_minor(minor):
            if pid != self_pid:
                local.append(pid)
                p = table.procs[pid]
                notes.append(f"pid {pid} ({p.command[:80]})")
        for gp in procs:
            p = table.get(gp.pid)
            if p is not None and not p.inspected and gp.pid not in local:
                local.append(gp.pid)
                notes.append(f"pid {gp.pid} ({p.command[:80]}; its fds cannot be read here)")
    mem = describe_memory(used)
    if local:
        return GpuIdleState(
            index, GpuState.BUSY, used, procs, tuple(local), f"held by {', '.join(notes)}; {mem} used", waited_ms
        )
    if procs:
        listed = ", ".join(f"pid {gp.pid} ({describe_memory(gp.used_memory)})" for gp in procs[:8])
        detail = (
            f"{mem} used by process(es) NVML lists but that hold nothing in this container: {listed} "
            "(another PID namespace); podguard cannot free it"
        )
    else:
        detail = f"{mem} used with no process listed by NVML and no holder here"
    return GpuIdleState(index, GpuState.PHANTOM, used, procs, (), f"phantom memory: {detail}", waited_ms)


def _wait_idle(
    backend: GpuBackend,
    gpu_indices: Sequence[int],
    *,
    deadline: float,
    idle_memory_mib: int,
    dev_dir: str | os.PathLike[str] | None,
    minors: Mapping[int, int] | None,
    self_pid: int,
    progress: Progress | None,
    while_busy: Callable[[], bool] | None = None,
) -> dict[int, GpuIdleState]:
    started = time.monotonic()
    idle_bytes = max(0, int(idle_memory_mib)) * MIB
    states: dict[int, GpuIdleState] = {}
    last: dict[int, tuple[tuple[GpuProcess, ...], int | None]] = {}
    errors: dict[int, str] = {}
    pending = list(dict.fromkeys(gpu_indices))
    delay = _BACKOFF_START_S
    next_note = started + _PROGRESS_EVERY_S
    while True:
        progressed = False
        for i in list(pending):
            try:
                idle, procs, used = _poll_gpu(backend, i, idle_bytes)
            except Exception as exc:  # a lost GPU must not crash the wait
                errors[i] = f"NVML query failed: {exc}"
                continue
            errors.pop(i, None)
            prev = last.get(i)
            if prev is not None and (len(procs) < len(prev[0]) or (used or 0) < (prev[1] or 0)):
                progressed = True  # memory is being released: look again soon
            last[i] = (procs, used)
            if idle:
                waited = (time.monotonic() - started) * 1000.0
                states[i] = GpuIdleState(i, GpuState.IDLE, used, procs, (), "idle", waited)
                pending.remove(i)
        now = time.monotonic()
        if not pending or now >= deadline:
            break
        if while_busy is not None and while_busy():
            progressed = True
        if progress is not None and now >= next_note:
            held = sum((last.get(i, ((), 0))[1] or 0) for i in pending)
            progress(
                f"waiting for {_gpus_text(pending)} to free memory: {describe_memory(held)} still used "
                f"({now - started:.0f}s of {deadline - started:.0f}s)"
            )
            next_note = now + _PROGRESS_EVERY_S
        delay = _BACKOFF_START_S if progressed else delay
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, _BACKOFF_CAP_S)
    if pending:
        waited = (time.monotonic() - started) * 1000.0
        table = scan_processes(dev_dir) if dev_dir is not None else None
        for i in pending:
            if i in errors and i not in last:
                states[i] = GpuIdleState(i, GpuState.UNKNOWN, None, (), (), errors[i], waited)
                continue
            procs, used = last.get(i, ((), None))
            minor = minors.get(i, i) if minors else i
            states[i] = _classify(i, procs, used, table, minor, self_pid, waited)
    return {i: states[i] for i in sorted(states)}


def wait_for_idle(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    deadline: float,
    idle_memory_mib: int = 512,
    dev_dir: str | os.PathLike[str] | None = None,
    minors: Mapping[int, int] | None = None,
    self_pid: int | None = None,
    progress: Progress | None = None,
) -> dict[int, GpuIdleState]:
    """Poll NVML until each GPU is idle or `deadline` (a `time.monotonic()` value) passes.

    Idle: no NVML process and `memory_used <= idle_memory_mib` MiB. Polls with backoff from 5 ms to
    100 ms (back to 5 ms whenever memory is seen going down), so a freed GPU is noticed within ~100 ms,
    and always polls at least once (a past deadline is a one-shot check). GPUs still not idle at the
    deadline are classified from a /proc scan of `dev_dir` (default `$PODGUARD_DEV_DIR` or /dev): busy
    when a local process holds the device file, phantom otherwise.
    """
    return _wait_idle(
        backend,
        list(gpu_indices),
        deadline=deadline,
        idle_memory_mib=idle_memory_mib,
        dev_dir=str(resolve_dev_dir(dev_dir)),
        minors=minors,
        self_pid=os.getpid() if self_pid is None else self_pid,
        progress=progress,
    )


# --------------------------------------------------------------------------------------------------
# The whole cleanup
# --------------------------------------------------------------------------------------------------


def _recommend(
    plan: CleanupPlan, actions: Sequence[KillRecord], skipped: Sequence[Skipped], states: Mapping[int, GpuIdleState]
) -> list[str]:
    recs: list[str] = []
    selected = set(plan.config.gpus)
    for i, s in sorted(states.items()):
        if s.state is GpuState.PHANTOM:
            recs.append(f"GPU{i}: {s.detail}; {HEAL_ADVICE}")
        elif s.state is GpuState.UNKNOWN:
            recs.append(f"GPU{i}: {s.detail}; run `podguard doctor`, and if the GPU is lost, {HEAL_ADVICE}")
    for a in actions:
        if a.outcome == "unkillable":
            recs.append(f"pid {a.pid} ({a.cmdline[:80]}) {_unkillable_text(a)}")
    for s in skipped:
        if not selected.intersection(s.gpus):
            continue
        if s.code == "protected":
            recs.append(
                f"{_gpus_text(s.gpus)} held by protected pid {s.pid} ({s.cmdline[:80]}): stop it yourself, "
                "or exclude that GPU with GPU_LIST"
            )
        elif s.code == "pid1":
            recs.append(f"{_gpus_text(s.gpus)} held by the container's PID 1: restart the container")
        elif s.code == "ancestor":
            recs.append(
                f"{_gpus_text(s.gpus)} held by pid {s.pid}, which started podguard: release the GPU there first"
            )
        elif s.code == "other_user":
            recs.append(f"{_gpus_text(s.gpus)} held by pid {s.pid} of another user: run podguard as root")
        elif s.code == "respawn_limit":
            recs.append(
                f"pid {s.pid} keeps coming back: its launcher is not recognised; pass its name with "
                "--kill-pattern so its whole job tree is stopped"
            )
    return list(dict.fromkeys(recs))


def _starters_still_running(actions: Sequence[KillRecord], config: PlanConfig) -> list[str]:
    """Name the still-running parents of stopped jobs that could start them again (a `while true` loop
    in a wrapper script): podguard does not climb into them without a pattern, so the user should know."""
    roots = {a.tree: a for a in actions if a.pid == a.tree and a.stopped}
    if not roots:
        return []
    table = scan_processes(config.dev_dir, fds=False)
    policy = Policy(table, config)
    out: list[str] = []
    for root, record in sorted(roots.items()):
        parent = table.get(record.parent)
        if parent is None or parent.zombie or parent.interactive_shell or policy.excluded(parent) is not None:
            continue
        out.append(
            f"pid {parent.pid} ({parent.command[:80]}) started the stopped job {root} and is still running; if it "
            "starts the job again, name it with --kill-pattern so its whole tree is stopped"
        )
    return out


def execute_cleanup(
    plan: CleanupPlan,
    backend: GpuBackend,
    *,
    grace_s: float = 10.0,
    busy_timeout_s: float = 60.0,
    idle_memory_mib: int = 512,
    dry_run: bool = False,
    progress: Progress | None = None,
    kill_timeout_s: float = 5.0,
    max_rounds: int = 3,
) -> CleanupResult:
    """Carry out `plan` (see the module doc) and wait for the selected GPUs' memory to come back.

    `busy_timeout_s` bounds the wait for memory, counted from the start of this call (the kill phase
    itself is bounded by `grace_s` + `kill_timeout_s` per round, so a round that stops a respawn found
    while waiting may end past the deadline by at most that much). `dry_run` signals nothing and returns
    the plan as `planned`, with the GPUs' current state from a single poll.
    """
    t_start = time.monotonic()
    deadline = t_start + max(0.0, busy_timeout_s)
    config = plan.config
    gpus = config.gpus
    timings: dict[str, float] = {"scan": plan.scan_ms, "plan": plan.plan_ms}
    skipped: dict[tuple[int, str], Skipped] = {(s.pid, s.code): s for s in plan.skipped}
    foreign: dict[tuple[int, int], ForeignProcess] = {(f.pid, f.gpu): f for f in plan.foreign}

    def wait(until: float, while_busy: Callable[[], bool] | None = None) -> dict[int, GpuIdleState]:
        return _wait_idle(
            backend,
            gpus,
            deadline=until,
            idle_memory_mib=idle_memory_mib,
            dev_dir=config.dev_dir,
            minors=config.minors,
            self_pid=config.self_pid,
            progress=progress,
            while_busy=while_busy,
        )

    if dry_run:
        for t in plan.targets:
            log.info(
                "dry run: would SIGTERM pid %d [%s] on %s (%s): %s | %s",
                t.pid,
                t.role,
                _gpus_text(t.gpus),
                _memory_text(t),
                t.reason,
                t.cmdline,
            )
        t0 = time.monotonic()
        states = wait(t0)
        timings["wait_idle"] = (time.monotonic() - t0) * 1000.0
        timings["total"] = plan.plan_ms + (time.monotonic() - t_start) * 1000.0
        recs = _recommend(plan, (), plan.skipped, states)
        if plan.targets:
            recs.insert(0, f"dry run: {len(plan.targets)} process(es) would be stopped; run without --dry-run")
        return CleanupResult(True, gpus, plan, (), plan.skipped, plan.foreign, states, 0, timings, tuple(recs))

    actions: list[KillRecord] = []
    done: set[tuple[int, int]] = set()
    rounds = 0
    stop_ms = 0.0
    rescan_ms = 0.0
    last_exit: float | None = None

    def run_round(current: CleanupPlan) -> bool:
        """Stop the not-yet-handled targets of `current`; False when there was nothing to do."""
        nonlocal rounds, stop_ms, last_exit
        fresh = [t for t in current.targets if (t.pid, t.start_time) not in done]
        if not fresh:
            return False
        if rounds >= max_rounds:
            for t in fresh:
                skipped.setdefault(
                    (t.pid, "respawn_limit"),
                    Skipped(
                        t.pid,
                        t.cmdline,
                        "respawn_limit",
                        f"appeared again after {max_rounds} cleanup rounds: left running ({t.reason})",
                        t.gpus,
                    ),
                )
                done.add((t.pid, t.start_time))
            return False
        rounds += 1
        if progress is not None:
            trees = {t.tree for t in fresh}
            progress(
                f"stopping {len(fresh)} process(es) in {len(trees)} job tree(s) holding "
                f"{_gpus_text(sorted({g for t in fresh for g in t.gpus}))} (round {rounds})"
            )
        t0 = time.monotonic()
        handles = _stop_round(fresh, config, rounds, grace_s, kill_timeout_s, progress)
        stop_ms += (time.monotonic() - t0) * 1000.0
        for h in handles:
            done.add((h.pid, h.target.start_time))
            actions.append(h.record())
            if h.exited_at is not None:
                last_exit = h.exited_at if last_exit is None else max(last_exit, h.exited_at)
        return True

    def rescan() -> CleanupPlan:
        nonlocal rescan_ms
        t0 = time.monotonic()
        current = replan(config, backend)
        rescan_ms += (time.monotonic() - t0) * 1000.0
        for s in current.skipped:
            skipped.setdefault((s.pid, s.code), s)
        for f in current.foreign:
            foreign.setdefault((f.pid, f.gpu), f)
        return current

    current = plan
    while run_round(current):
        current = rescan()

    next_rescan = [time.monotonic() + _RESCAN_START_S, _RESCAN_START_S]

    def while_busy() -> bool:
        """Between polls: look for respawned holders now and then (backoff up to 1 s). Once the rounds
        are used up, a rescan only records what keeps coming back (`respawn_limit`)."""
        now = time.monotonic()
        if now < next_rescan[0]:
            return False
        next_rescan[1] = min(next_rescan[1] * 2, _RESCAN_CAP_S)
        next_rescan[0] = now + next_rescan[1]
        acted = False
        while run_round(rescan()):
            acted = True
        return acted

    t_wait = time.monotonic()
    states = wait(deadline, while_busy)
    t_idle = time.monotonic()
    timings.update(
        stop=stop_ms,
        rescan=rescan_ms,
        wait_idle=(t_idle - t_wait) * 1000.0,
        total=plan.plan_ms + (t_idle - t_start) * 1000.0,
    )
    if last_exit is not None and all(s.idle for s in states.values()):
        timings["release_after_last_exit"] = max(0.0, (t_idle - last_exit) * 1000.0)
    for s in states.values():
        if s.state is GpuState.PHANTOM:
            log.warning("GPU%d: %s; %s", s.index, s.detail, HEAL_ADVICE)
        elif s.state is GpuState.BUSY:
            log.warning("GPU%d still busy: %s", s.index, s.detail)
    final_skipped = tuple(sorted(skipped.values(), key=lambda s: (s.pid, s.code)))
    recs = _recommend(plan, actions, final_skipped, states)
    recs.extend(_starters_still_running(actions, config))
    return CleanupResult(
        False,
        gpus,
        plan,
        tuple(actions),
        final_skipped,
        tuple(foreign.values()),
        states,
        rounds,
        timings,
        tuple(recs),
    )


def cleanup(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    dev_dir: str | os.PathLike[str] | None = None,
    protect: Sequence[str] = (),
    patterns: Sequence[str] = (),
    self_pid: int | None = None,
    grace_s: float = 10.0,
    busy_timeout_s: float = 60.0,
    idle_memory_mib: int = 512,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> CleanupResult:
    """`plan_cleanup` then `execute_cleanup`, for callers that do not need to look at the plan first."""
    plan = plan_cleanup(backend, gpu_indices, dev_dir=dev_dir, protect=protect, patterns=patterns, self_pid=self_pid)
    return execute_cleanup(
        plan,
        backend,
        grace_s=grace_s,
        busy_timeout_s=busy_timeout_s,
        idle_memory_mib=idle_memory_mib,
        dry_run=dry_run,
        progress=progress,
    )

"""Waiting for GPU memory to come back, and what a GPU that did not come back is: busy, phantom or unknown.

    states = wait_for_idle(backend, [0, 1], deadline=time.monotonic() + 60)
    states[0].state  # GpuState.IDLE / BUSY / PHANTOM / UNKNOWN

Idle = NVML lists no process and memory used <= the idle threshold. A query NVML cannot answer (no
permission, not supported, GPU lost) is UNKNOWN, never idle. On a MIG GPU the selected MIG devices are
polled, not the parent. Polls back off from 5 ms to 100 ms, back to 5 ms whenever memory goes down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from podguard import console
from podguard.gpu.backend import GpuBackend, GpuProcess, GpuQueryError
from podguard.preflight.cleanup.devices import resolve_dev_dir
from podguard.preflight.cleanup.planner import build_plan, gpu_list, short
from podguard.preflight.cleanup.process_table import ProcessTable, scan_processes
from podguard.preflight.cleanup.vocabulary import Evidence, GpuIdleState, GpuState, PlanConfig
from podguard.units import MIB, describe_memory

__all__ = ["IdleWatch", "Throttle", "wait_for_idle"]

BACKOFF_START_S = 0.005
BACKOFF_CAP_S = 0.100
PROGRESS_EVERY_S = 1.0


class Throttle:
    """When a long wait says how it goes: at most once per PROGRESS_EVERY_S (the first after one period); `next_at`
    bounds a poll that must wake for it. The cleanup's every wait uses it (the kill rounds, the wait for memory)."""

    def __init__(self) -> None:
        self.every_s = PROGRESS_EVERY_S
        self.next_at = time.monotonic() + self.every_s

    def due(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.every_s
        return True


@dataclass(frozen=True)
class GpuPoll:
    """One look at one GPU (or its selected MIG devices)."""

    processes: tuple[GpuProcess, ...]
    used: int | None
    unknown: str | None  # why NVML could not tell; None when it could
    idle: bool
    lost: bool = False  # NVML answered GPU_IS_LOST: no wait can make it idle (the gate fails it, 76)


def poll_gpu(backend: GpuBackend, index: int, idle_bytes: int, mig: Sequence[str] = ()) -> GpuPoll:
    procs: list[GpuProcess] = []
    used_total: int | None = 0
    idle = True
    for device in mig or (None,):
        where = f"MIG device {device}" if device else f"GPU{index}"
        try:
            listed = backend.processes(index, mig=device) if device else backend.processes(index)
        except GpuQueryError as exc:
            return GpuPoll(tuple(procs), None, str(exc), False, lost=exc.code == "GPU_IS_LOST")  # (names the GPU)
        except (IndexError, RuntimeError, OSError) as exc:  # a backend failure must not crash the wait
            return GpuPoll(tuple(procs), None, f"{where}: NVML query failed: {exc}", False)
        used = backend.memory_used(index, mig=device) if device else backend.memory_used(index)
        if used is None:
            return GpuPoll(tuple(procs), None, f"{where}: its memory use cannot be read", False)
        procs.extend(listed)
        used_total = (used_total or 0) + used
        idle = idle and not listed and used <= idle_bytes
    return GpuPoll(tuple(procs), used_total, None, idle)


class IdleWatch:
    """Polls a set of GPUs; `poll()` says whether all are idle right now; `states()` classifies them."""

    def __init__(
        self,
        backend: GpuBackend,
        gpus: Sequence[int],
        *,
        idle_memory_mib: int,
        mig: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        self.backend = backend
        self.gpus = list(dict.fromkeys(gpus))
        self.idle_bytes = max(0, int(idle_memory_mib)) * MIB
        self.mig = dict(mig or {})
        self.started = time.monotonic()
        self.last: dict[int, GpuPoll] = {}
        self.idle_since: dict[int, float] = {}
        self.progressed = False  # memory went down in the last poll: look again soon

    def poll(self) -> bool:
        self.progressed = False
        now = time.monotonic()
        for i in self.gpus:
            got = poll_gpu(self.backend, i, self.idle_bytes, self.mig.get(i, ()))
            prev = self.last.get(i)
            if prev is not None and (len(got.processes) < len(prev.processes) or (got.used or 0) < (prev.used or 0)):
                self.progressed = True
            self.last[i] = got
            if got.idle:
                self.idle_since.setdefault(i, now)
            else:
                self.idle_since.pop(i, None)
        return all(self.last[i].idle for i in self.gpus)

    @property
    def hopeless(self) -> bool:
        """Every GPU still pending is lost: waiting longer cannot help, the gate will fail it."""
        pending = self.pending
        return bool(pending) and all(i in self.last and self.last[i].lost for i in pending)

    @property
    def pending(self) -> list[int]:
        return [i for i in self.gpus if not (i in self.last and self.last[i].idle)]

    def note(self, deadline: float) -> str:
        pending = self.pending
        held = sum(self.last[i].used or 0 for i in pending if i in self.last)
        now = time.monotonic()
        return (
            f"waiting for {gpu_list(pending)} to free memory: {describe_memory(held)} still used "
            f"({now - self.started:.0f}s of {deadline - self.started:.0f}s)"
        )

    def states(self, config: PlanConfig, table: ProcessTable | None = None) -> dict[int, GpuIdleState]:
        """Each GPU's final state; GPUs not idle are classified from a /proc scan with the planner's rules."""
        out: dict[int, GpuIdleState] = {}
        pending = self.pending
        if pending and table is None:
            table = scan_processes(config.dev_dir)
        now = time.monotonic()
        for i in self.gpus:
            poll = self.last.get(i)
            if i not in pending and poll is not None:
                waited = (self.idle_since.get(i, now) - self.started) * 1000.0
                out[i] = GpuIdleState(i, GpuState.IDLE, poll.used, poll.processes, (), "idle", waited)
            else:
                assert table is not None
                out[i] = classify(i, poll, table, config, (now - self.started) * 1000.0)
        return {i: out[i] for i in sorted(out)}


def classify(
    index: int, poll: GpuPoll | None, table: ProcessTable, config: PlanConfig, waited_ms: float
) -> GpuIdleState:
    """A GPU that is not idle: unknown when NVML cannot tell, busy when a local holder is left, else phantom."""
    if poll is None or poll.unknown is not None:
        why = poll.unknown if poll is not None else "never polled"
        return GpuIdleState(index, GpuState.UNKNOWN, None, (), (), f"cannot tell whether it is free: {why}", waited_ms)
    plan = build_plan(table, {index: poll.processes}, config)
    local = [h for h in plan.holders if index in h.gpus]
    mem = describe_memory(poll.used)
    if local:
        unreadable = "; its fds cannot be read here"
        notes = ", ".join(
            f"pid {h.pid} ({short(h.cmdline, 80)}{unreadable if h.evidence is Evidence.NVML else ''})" for h in local
        )
        detail = f"held by {notes}; {mem} used"
        return GpuIdleState(
            index, GpuState.BUSY, poll.used, poll.processes, tuple(h.pid for h in local), detail, waited_ms
        )
    if poll.processes:
        listed = ", ".join(f"pid {gp.pid} ({describe_memory(gp.used_memory)})" for gp in poll.processes[:8])
        detail = (
            f"{mem} used by process(es) NVML lists but that hold nothing in this container: {listed} "
            "(another PID namespace); podguard cannot free it"
        )
    else:
        detail = f"{mem} used with no process listed by NVML and no holder here"
    minor = config.minors.get(index, index)
    fd_only = [pid for pid in table.holders_of_minor(minor) if pid != config.self_pid]
    if fd_only and index not in config.mig:
        shown = ", ".join(f"pid {pid} ({short(table.procs[pid].safe_command, 60)})" for pid in fd_only[:4])
        detail += f"; local process(es) with its device file open that NVML does not list: {shown}"
    return GpuIdleState(index, GpuState.PHANTOM, poll.used, poll.processes, (), f"phantom memory: {detail}", waited_ms)


def wait_for_idle(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    deadline: float,
    idle_memory_mib: int = 512,
    dev_dir: str | os.PathLike[str] | None = None,
    minors: Mapping[int, int] | None = None,
    mig: Mapping[int, Sequence[str]] | None = None,
    self_pid: int | None = None,
) -> dict[int, GpuIdleState]:
    """Poll NVML until each GPU is idle or `deadline` (a `time.monotonic()` value) passes.

    Always polls at least once (a past deadline is a one-shot check), so a freed GPU is noticed within
    ~100 ms. GPUs still not idle at the deadline are classified with a /proc scan of `dev_dir` (default
    `$PODGUARD_DEV_DIR` or /dev): unknown, busy (a local holder) or phantom.
    """
    gpus = list(dict.fromkeys(gpu_indices))
    watch = IdleWatch(backend, gpus, idle_memory_mib=idle_memory_mib, mig=mig)
    notes = Throttle()
    delay = BACKOFF_START_S
    while True:
        if watch.poll() or watch.hopeless:
            break
        now = time.monotonic()
        if now >= deadline:
            break
        if notes.due(now):
            console.say(watch.note(deadline))
        delay = BACKOFF_START_S if watch.progressed else delay
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, BACKOFF_CAP_S)
    config = PlanConfig(
        gpus=tuple(gpus),
        dev_dir=str(resolve_dev_dir(dev_dir)),
        self_pid=os.getpid() if self_pid is None else self_pid,
        minors=dict(minors) if minors else {i: i for i in gpus},
        mig={i: tuple(m) for i, m in (mig or {}).items()},
    )
    return watch.states(config)

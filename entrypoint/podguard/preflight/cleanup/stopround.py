"""One round of stopping job trees: freeze, SIGTERM launcher first, thaw, grace, freeze survivors, SIGKILL.

    procs = StopRound(targets, config, round_no=1, grace_s=7, kill_timeout_s=5, ).run()
    [p.record() for p in procs]  # KillRecords

Why freeze first, why launcher first, and why exits are awaited with poll() on pidfds: docs/cleanup.md.
Signals to podguard itself are deferred while anything is frozen (`deferral`).
"""

from __future__ import annotations

import logging
import math
import select
import signal
import time
from collections.abc import Sequence

from podguard import console
from podguard.preflight.cleanup.advice import HEAL_ADVICE, gpus_text, memory_text, unkillable_text
from podguard.preflight.cleanup.deferral import deferred_signals
from podguard.preflight.cleanup.idle import Throttle
from podguard.preflight.cleanup.pidfd import PinnedProcess
from podguard.preflight.cleanup.planner import short
from podguard.preflight.cleanup.policy import Policy
from podguard.preflight.cleanup.process_table import read_stat, scan_processes
from podguard.preflight.cleanup.vocabulary import Outcome, PlanConfig, Role, Target

__all__ = ["StopRound"]

log = logging.getLogger("podguard.cleanup")


BACKOFF_START_S = 0.005
BACKOFF_CAP_S = 0.100
_ADOPT_PASSES = 4


class StopRound:
    """Stops `targets` (already in signal order) and reports each one's outcome."""

    def __init__(
        self,
        targets: Sequence[Target],
        config: PlanConfig,
        round_no: int,
        *,
        grace_s: float,
        kill_timeout_s: float,
    ) -> None:
        self.procs = [PinnedProcess(t, round_no) for t in targets]
        self.config = config
        self.round = round_no
        self.grace_s = grace_s
        self.kill_timeout_s = kill_timeout_s

    def run(self) -> list[PinnedProcess]:
        for p in self.procs:
            p.open()
        try:
            with deferred_signals():
                self._freeze_term_thaw()
            if any(p.live for p in self.procs):
                sent = sum(1 for p in self.procs if p.signals)
                console.say(f"sent SIGTERM to {sent} process(es); grace {self.grace_s:g}s")
            self._wait_exits(self.procs, time.monotonic() + self.grace_s, "SIGTERM")
            if any(p.live for p in self.procs):
                with deferred_signals():
                    survivors = self._freeze_kill()
                self._wait_exits(survivors, time.monotonic() + self.kill_timeout_s, "SIGKILL")
                self._mark_unkillable(survivors)
        finally:
            for p in self.procs:
                p.close()
        return self.procs

    # -- phases ----------------------------------------------------------------------------------------

    def _freeze_term_thaw(self) -> None:
        """SIGSTOP every tree (launcher first), adopt what was forked meanwhile, SIGTERM all, SIGCONT all:
        each process wakes with SIGTERM pending, so an agent runs its shutdown instead of respawning."""
        frozen: list[PinnedProcess] = []
        try:
            for p in self.procs:
                if p.send(signal.SIGSTOP, record=False):
                    frozen.append(p)
            self._adopt_new_members(frozen)
            for p in self.procs:
                if p.send(signal.SIGTERM):
                    self._log(logging.INFO, "SIGTERM", p.target, "")
        finally:
            for p in frozen:
                p.send(signal.SIGCONT, record=False)

    def _freeze_kill(self) -> list[PinnedProcess]:
        """Freeze the survivors, adopt what they forked, SIGKILL them (launcher first)."""
        frozen: list[PinnedProcess] = []
        try:
            for p in self.procs:
                if p.live and p.send(signal.SIGSTOP, record=False):
                    frozen.append(p)
            self._adopt_new_members(frozen)
            survivors = [p for p in self.procs if p.live]
            for p in survivors:
                if p.send(signal.SIGKILL):
                    self._log(logging.WARNING, "SIGKILL", p.target, f" after {self.grace_s:.3g}s grace")
            return survivors
        finally:
            for p in frozen:  # a SIGKILLed process dies frozen or not; anything else must not stay stopped
                if p.live and "SIGKILL" not in p.signals:
                    p.send(signal.SIGCONT, record=False)

    def _adopt_new_members(self, frozen: list[PinnedProcess]) -> None:
        """List the children of the (frozen) members again; pin, freeze and add those forked since the scan.

        A child forked after our scan would otherwise escape (a launcher respawning its worker during the
        grace period); once every member is stopped nobody can fork, so a few passes reach a fixed point.
        Only live members are looked under (a dead member's pid may already be reused).
        """
        for _pass in range(_ADOPT_PASSES):
            table = scan_processes(self.config.dev_dir, fds=False)
            policy = Policy(table, self.config)
            known = {(p.pid, p.target.start_time) for p in self.procs}
            frontier = [(p.pid, p.target.tree) for p in self.procs if p.live]
            added = 0
            while frontier:
                nxt: list[tuple[int, int]] = []
                for parent, tree in frontier:
                    for child in table.children(parent):
                        info = table.procs[child]
                        if info.zombie or (child, info.start_time) in known or policy.excluded(info) is not None:
                            continue
                        target = Target(
                            pid=child,
                            start_time=info.start_time,
                            cmdline=short(info.safe_command),
                            name=info.display_name,
                            role=Role.MEMBER,
                            tree=tree,
                            reason=f"started in the job tree of {tree} (by pid {parent}) while it was being stopped",
                            uid=info.uid,
                            parent=parent,
                        )
                        proc = PinnedProcess(target, self.round)
                        proc.open()
                        if proc.live and proc.send(signal.SIGSTOP, record=False):
                            self.procs.append(proc)
                            frozen.append(proc)
                            known.add((child, info.start_time))
                            added += 1
                            nxt.append((child, tree))
                frontier = nxt
            if not added:
                return

    def _wait_exits(self, procs: Sequence[PinnedProcess], deadline: float, what: str) -> None:
        """Block until every live process has exited or the deadline passes; returns at once when all exit.
        Exit = became a zombie or disappeared (a zombie has released its files and GPU memory)."""
        pending = [p for p in procs if p.live]
        poller = select.poll()
        by_fd: dict[int, PinnedProcess] = {}
        for p in pending:
            if p.pidfd is not None:
                poller.register(p.pidfd, select.POLLIN)
                by_fd[p.pidfd] = p
        delay = BACKOFF_START_S
        started = time.monotonic()
        notes = Throttle()
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            timeout = deadline - now
            polled = [p for p in pending if p.pidfd is None]
            if polled:
                timeout = min(timeout, delay)
                delay = min(delay * 2, BACKOFF_CAP_S)
            timeout = min(timeout, max(0.0, notes.next_at - now))
            for fd, _event in poller.poll(max(1, math.ceil(timeout * 1000))):
                by_fd[fd].mark_exited(time.monotonic())
                poller.unregister(fd)
            for p in polled:
                if p.has_exited():
                    p.mark_exited(time.monotonic())
            pending = [p for p in pending if p.live]
            now = time.monotonic()
            if pending and notes.due(now):
                console.say(f"waiting for {len(pending)} process(es) to exit after {what} ({now - started:.0f}s)")

    def _mark_unkillable(self, survivors: Sequence[PinnedProcess]) -> None:
        for p in survivors:
            if p.live:
                st = read_stat(p.pid)
                p.state = st.state if st is not None else None
                p.outcome = Outcome.UNKILLABLE
                p.note = unkillable_text(p.state)
                console.warn(
                    f"pid {p.pid} ({p.target.cmdline}) is still there {self.kill_timeout_s:.3g}s after SIGKILL "
                    f"(state {p.state}): unkillable; {HEAL_ADVICE}"
                )

    @staticmethod
    def _log(level: int, sig: str, t: Target, after: str) -> None:
        """Each signal sent: a SIGKILL is said (a job that ignored its grace), a SIGTERM is a record for the
        cleanup's logger (PODGUARD_DEBUG=1 shows it; the report lists every kill)."""
        where = f"{gpus_text(t.gpus)} ({memory_text(t)})"
        text = f"{sig} pid {t.pid} [{t.role.value}] on {where}{after}: {t.reason} | {t.cmdline}"
        if level >= logging.WARNING:
            console.warn(text)
        else:
            log.log(level, "%s", text)

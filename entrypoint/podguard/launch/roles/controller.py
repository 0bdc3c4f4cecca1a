"""Run a roles plan: start each role once the roles in its `after` are ready, inside one supervised job.

    outcome = run_roles("job.toml", selection, master_port=29500, log_dir=logs)

Readiness (a log line, a URL answering, a service started, a one-shot step finished) and timeouts:
docs/roles.md. URL probes run in helper threads that hand their result to the supervisor's loop.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

from podguard import console
from podguard.errors import ExitCode
from podguard.launch.loop import Timer
from podguard.launch.modes import DEFAULT_MASTER_ADDR
from podguard.launch.printer import LineCallback
from podguard.launch.process import Worker
from podguard.launch.roles.config import ReadyKind, RolesPlan, load_roles
from podguard.launch.run import check_only, check_specs
from podguard.launch.spec import JobOutcome
from podguard.launch.supervisor import DEFAULT_GRACE_S, Controller, Supervisor, Watch

if TYPE_CHECKING:
    from podguard.gpu.selected import Selection

__all__ = ["READY_TIMEOUT_EXIT", "RoleState", "RolesController", "run_roles"]

READY_TIMEOUT_EXIT = ExitCode.READY_TIMEOUT
_URL_POLL_FIRST_S = 0.1
_URL_POLL_MAX_S = 2.0


class RoleState(StrEnum):
    WAITING = "waiting"  # for the roles in its `after`
    STARTED = "started"
    READY = "ready"


class ReadyHow(StrEnum):
    """How a role became ready, for the line that says so."""

    STARTED = "started"  # a service without a ready check: ready once started (no line)
    FINISHED = "finished"  # a one-shot step whose workers all exited 0
    ANSWERED = "answered"  # its URL answered


def _poll_url(url: str, stop: threading.Event, on_ready: Callable[[], None]) -> None:
    """Poll `url` until it answers 2xx/3xx; backoff 0.1 s doubling to 2 s. No proxies: it is local."""
    import urllib.error  # noqa: PLC0415  lazy: urllib.request: ~30 ms of imports that only the roles mode needs
    import urllib.request  # noqa: PLC0415  lazy: urllib.request: ~30 ms of imports that only the roles mode needs

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    delay = _URL_POLL_FIRST_S
    while not stop.is_set():
        try:
            with opener.open(url, timeout=2.0) as response:
                if 200 <= response.status < 400:
                    on_ready()
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        except Exception:  # http.client oddities from a half-started server: just try again
            pass
        if stop.wait(delay):
            return
        delay = min(delay * 2, _URL_POLL_MAX_S)


@dataclass
class _RoleRun:
    """One role's progress inside the job."""

    role_name: str
    state: RoleState = RoleState.WAITING
    started_at: float = 0.0
    ready_workers: set[str] = field(default_factory=set)
    watchers: list[tuple[str, LineCallback]] = field(default_factory=list)
    timer: Timer | None = None


class RolesController(Controller):
    """Starts each role once the roles in its `after` are ready; see the module docstring."""

    def __init__(self, plan: RolesPlan) -> None:
        self.plan = plan
        self.states = {r.name: _RoleRun(r.name) for r in plan.roles}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sup: Supervisor | None = None
        self._by_worker = {s.name: r.name for r in plan.roles for s in r.specs}

    @property
    def sup(self) -> Supervisor:
        assert self._sup is not None, "the controller is not running"
        return self._sup

    def on_start(self, sup: Supervisor) -> None:
        self._sup = sup
        self._start_ready_roles()

    def more_to_start(self) -> bool:
        if self._sup is not None and self._sup.stopping:
            return False
        return any(st.state is RoleState.WAITING for st in self.states.values())

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=3.0)

    def _start_ready_roles(self) -> None:
        for st in self.states.values():
            if self.sup.stopping:
                return
            if st.state is RoleState.WAITING and all(
                self.states[d].state is RoleState.READY for d in self.plan.role(st.role_name).after
            ):
                self._start_role(st)

    def _start_role(self, st: _RoleRun) -> None:
        sup, role = self.sup, self.plan.role(st.role_name)
        st.state = RoleState.STARTED
        st.started_at = time.monotonic()
        if role.after:
            console.say(f"starting role {role.name} ({', '.join(role.after)} ready)")
        for spec in role.specs:
            sup.start(spec)
            if role.ready is not None and role.ready.kind is ReadyKind.LOG:
                callback = self._log_watcher(st, re.compile(role.ready.target))
                sup.printer.watch(spec.name, callback)
                st.watchers.append((spec.name, callback))
        if role.ready is None:
            if role.service:
                self._mark_ready(st, ReadyHow.STARTED)
            return  # a one-shot step: ready when all its workers exited 0 (on_exit)
        st.timer = sup.call_later(role.ready.timeout_s, lambda: self._timed_out(st))
        if role.ready.kind is ReadyKind.URL:
            self._probe(st, role.ready.target)

    def _probe(self, st: _RoleRun, url: str) -> None:
        sup = self.sup

        def answered() -> None:
            sup.call_from_thread(lambda: self._mark_ready(st, ReadyHow.ANSWERED))

        thread = threading.Thread(
            target=_poll_url, args=(url, self._stop, answered), name=f"podguard-ready-{st.role_name}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _log_watcher(self, st: _RoleRun, pattern: re.Pattern[str]) -> LineCallback:
        count = len(self.plan.role(st.role_name).specs)

        def on_line(worker: str, line: str) -> None:
            if st.state is RoleState.STARTED and pattern.search(line):
                st.ready_workers.add(worker)
                if len(st.ready_workers) == count:
                    self._mark_ready(st, f"printed /{pattern.pattern}/")

        return on_line

    def _mark_ready(self, st: _RoleRun, how: str) -> None:
        sup = self.sup
        if st.state is not RoleState.STARTED:
            return
        st.state = RoleState.READY
        if st.timer is not None:
            st.timer.cancel()
        for worker, callback in st.watchers:
            sup.printer.unwatch(worker, callback)
        st.watchers.clear()
        took = time.monotonic() - st.started_at
        if how == ReadyHow.FINISHED:
            console.say(f"role {st.role_name} finished ({took:.1f} s)")
        elif how != ReadyHow.STARTED:
            console.say(f"role {st.role_name} is ready ({how}, {took:.1f} s)")
        self._start_ready_roles()

    def _timed_out(self, st: _RoleRun) -> None:
        sup, role = self.sup, self.plan.role(st.role_name)
        if st.state is not RoleState.STARTED or sup.stopping:
            return
        assert role.ready is not None
        waiting = [s.name for s in role.specs if s.name not in st.ready_workers]
        sup.fail(
            waiting[0] if waiting else role.specs[0].name,
            READY_TIMEOUT_EXIT,
            f"role {role.name} was not ready after {role.ready.timeout_s:g} s (waiting for {role.ready.describe()})",
        )

    def on_exit(self, sup: Supervisor, worker: Worker) -> None:
        role_name = self._by_worker.get(worker.name)
        if role_name is None or self.states[role_name].state is not RoleState.STARTED:
            return
        specs = self.plan.role(role_name).specs
        workers = [sup.workers[s.name] for s in specs if s.name in sup.workers]
        if len(workers) == len(specs) and all(not w.alive and w.popen.returncode == 0 for w in workers):
            # a one-shot step (or a role that finished before saying "ready"): it is done
            self._mark_ready(self.states[role_name], ReadyHow.FINISHED)


def run_roles(
    job: str | os.PathLike[str] | RolesPlan,
    selection: Selection,
    *,
    master_port: int | str,
    master_addr: str = DEFAULT_MASTER_ADDR,
    log_dir: Path | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    terminal: BinaryIO | TextIO | int | None = None,
    only: Collection[str] | None = None,
    tail_lines: int = 20,
    summary: bool = True,
    watch: Watch | None = None,
) -> JobOutcome:
    """Run a roles job file (or an already loaded plan) to its end; see the module docstring."""
    plan = (
        job
        if isinstance(job, RolesPlan)
        else load_roles(job, selection, master_port=master_port, master_addr=master_addr, log_dir=log_dir)
    )
    check_specs(plan.specs())
    check_only(plan.specs(), only)
    sup = Supervisor(grace_s=grace_s, terminal=terminal, only=only, tail_lines=tail_lines, summary=summary, watch=watch)
    return sup.run(RolesController(plan))

"""The supervisor: start workers, multiplex their output, fail fast, forward signals, reap, report.

    sup = Supervisor(grace_s=7.0)
    outcome = sup.run(controller)          # JobOutcome: exit code, each worker's exit, the root cause

One single-threaded event loop (must run in the main thread): every worker's pipe, the signal wakeup fd
(`signals.py`) and a pipe for calls from helper threads; timers set the select timeout. The first worker
that fails is the root cause and every other worker's group gets SIGTERM, SIGKILL after the grace;
SIGTERM/SIGINT/SIGHUP to podguard are forwarded the same way and end the job with 128+N; SIGUSR1/2 are
passed through. Leftover descendants are reaped and stopped (`orphans.py`); if podguard itself is
killed, a per-job watchdog stops the job (`watchdog.py`); output is written off the loop (`sinks.py`).
Every podguard line of the run, from any thread, goes to the terminal with the workers' lines (`route.py`).
The rules and their reasons: docs/supervisor.md.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Collection
from typing import BinaryIO, Protocol, TextIO

from podguard import console
from podguard.errors import DEFAULT_GRACE_S, ExitCode, UsageError, signal_exit_code
from podguard.launch.loop import EventLoop, Timer
from podguard.launch.orphans import Orphans, describe_pids, set_subreaper, stop_helpers
from podguard.launch.printer import LineCallback, Printer, Stream
from podguard.launch.process import Worker, start_worker
from podguard.launch.route import TerminalRoute
from podguard.launch.shutdown import KillSequence
from podguard.launch.signals import PASSED_THROUGH, TERMINATING, SignalRouter, signal_name
from podguard.launch.spec import JobOutcome, WorkerExit, WorkerSpec
from podguard.launch.summary import describe_exit, format_summary, job_detail
from podguard.launch.watchdog import Watchdog
from podguard.procfs import children_of

__all__ = ["DEFAULT_GRACE_S", "Controller", "Supervisor", "Timer", "Watch", "format_summary"]

LEFTOVER_WAIT_S = 2.0  # after SIGKILL, how long to wait for the kernel to reap stragglers (D state)
DRAIN_WAIT_S = 0.5  # after everything exited, how long a pipe may stay open (held by an outsider)
DRAIN_BACKLOG_CAP = 64 << 20  # ... and how far the output sinks may fall behind while it is read
OUTPUT_STALL_S = 1.0  # at the end: give up on a terminal/log sink that made no progress for this long
OUTPUT_CAP_S = 3.0  # ... or that is still behind after this long in all


class Controller:
    """Hooks for modes that start workers over time (roles). The default: everything starts at once."""

    def on_start(self, sup: Supervisor) -> None:
        """Called once in the loop, before anything else: start the first workers."""

    def on_exit(self, sup: Supervisor, worker: Worker) -> None:
        """A worker exited (already reaped, its output drained)."""

    def more_to_start(self) -> bool:
        """True while some workers are still waiting to be started (the job is not done yet)."""
        return False

    def close(self) -> None:
        """The job ended: stop helper threads."""


class Watch(Protocol):
    """Something that watches the job from the loop (the billing guards): timers set in `start`, `sup.fail()`
    to end the job. A watch may also have `cause_of_exit(worker_gpus, code) -> (code, text) | None`: asked when
    a worker fails on its own, it names a root cause the worker's code cannot know (a fatal fault on its GPU)."""

    def start(self, sup: Supervisor) -> None: ...

    def close(self) -> None: ...


class Supervisor:
    """Runs one job. Use `run_job()` for the common case; see the module docstring for the rules.

    `fail_fast=False` makes the workers independent (sweeps): a failure is recorded as the root cause
    (its code is the job's) but does not stop the others.
    """

    def __init__(
        self,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        terminal: BinaryIO | TextIO | int | None = None,
        only: Collection[str] | None = None,
        on_line: LineCallback | None = None,
        tail_lines: int = 20,
        pdeathsig: int | None = signal.SIGTERM,
        subreaper: bool = True,
        summary: bool = True,
        fail_fast: bool = True,
        watch: Watch | None = None,
    ) -> None:
        if not grace_s >= 0:
            raise UsageError(f"grace period {grace_s!r} s is not valid; expected a number of seconds >= 0")
        self.grace_s = float(grace_s)
        self._loop = EventLoop()
        self.printer = Printer(
            terminal, only=only, on_line=on_line, tail_lines=tail_lines, background=True, on_drained=self._loop.wake
        )
        self.workers: dict[str, Worker] = {}
        self._pdeathsig = pdeathsig
        self._subreaper = subreaper
        self._summary = summary
        self._fail_fast = fail_fast
        self.job_id = f"{os.getpid()}-{time.time_ns()}"
        self._orphans = Orphans(self.job_id)
        self._told_leftovers: set[int] = set()  # leftovers already named in a line (each is named once)
        self._watchdog: Watchdog | None = None
        self._shutdown = KillSequence(self.grace_s)
        self._signal: int | None = None  # the terminating signal podguard received first
        self._root: str | None = None  # name of the root-cause worker
        self._root_code: int | None = None  # exit code override (service exited 0, ready timeout)
        self._root_detail = ""
        self._ended_ok = False  # every non-service worker finished successfully
        self._started_at = time.monotonic()
        self.started_wall = time.time()
        self._sigs: SignalRouter | None = None
        self._controller = Controller()
        self._watch = watch

    # -- API used by controllers (roles) ----------------------------------------------------------
    def start(self, spec: WorkerSpec) -> Worker:
        """Start a worker now (before or during `run()`)."""
        if spec.name in self.workers:
            raise UsageError(f"two workers are named {spec.name!r}; worker names must be unique")
        worker = start_worker(spec, pdeathsig=self._pdeathsig, job_id=self.job_id)
        if self._watchdog is not None:
            self._watchdog.watch_group(worker.pid)
        self.workers[spec.name] = worker
        stream = self.printer.add(spec.name, worker.fd, prefix=spec.prefix, log_path=spec.log_path)
        self._loop.add_reader(worker.fd, stream)
        if self._shutdown.stopping:
            self._shutdown.late_joiner(worker)
        return worker

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        return self._loop.call_later(delay, fn)

    def call_from_thread(self, fn: Callable[[], None]) -> None:
        """Run `fn` in the loop's thread soon; safe to call from any thread."""
        self._loop.call_from_thread(fn)

    def fail(self, worker: str | None, code: int, detail: str, *, grace_s: float | None = None) -> None:
        """Declare the job failed (e.g. a role that never became ready) and stop everything; `grace_s` shortens
        the grace before SIGKILL (a hung job: its end has a deadline), also for a shutdown already under way (a
        SIGTERM that came while the hang's evidence was taken)."""
        if grace_s is not None:
            if self._shutdown.stopping:
                self._shutdown.shorten(grace_s)
            else:
                self._shutdown.grace_s = min(self._shutdown.grace_s, max(grace_s, 0.0))
        if self._root is None and not self._shutdown.stopping:
            self._root = worker
            self._root_code = code
            self._root_detail = detail
            console.say(f"{detail}; stopping {self._live_count()} worker(s)", loud=True)
        self.stop()

    def end_with(self, code: int, detail: str) -> None:
        """The job's outcome should it end before `fail()` (a billing guard waiting for the job's save: the
        workers keep running and may exit on their own); a worker's own failure still names its root cause."""
        if self._root is None and self._root_code is None and not self._shutdown.stopping:
            self._root_code, self._root_detail = code, detail

    @property
    def stopping(self) -> bool:
        return self._shutdown.stopping

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Begin the shutdown: `signum` to every live worker's group now, SIGKILL after the grace."""
        self._shutdown.begin(self.workers.values(), self._orphans, signum)

    def kill_now(self) -> None:
        """SIGKILL every live worker group and every leftover child."""
        self._shutdown.kill_now(self.workers.values(), self._orphans)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, controller: Controller | None = None) -> JobOutcome:
        """Run until every worker (and every leftover descendant) is gone; return the outcome."""
        if controller is not None:
            self._controller = controller
        self._orphans.preexisting = set(children_of(os.getpid())) - {w.pid for w in self.workers.values()}
        previous_subreaper = set_subreaper(True) if self._subreaper else None
        self._sigs = SignalRouter()
        self._watchdog = Watchdog.start(self.job_id, grace_s=self.grace_s)
        if self._watchdog.pid is not None:
            self._orphans.ignore.add(self._watchdog.pid)
        for worker in self.workers.values():  # started before run()
            self._watchdog.watch_group(worker.pid)
        self._loop.add_reader(self._sigs.rfd, "signals", pausable=False)
        route = TerminalRoute(self.printer, self._loop)
        with console.routed(route):  # every podguard line of the run, from any thread: the terminal, in order
            try:
                self._controller.on_start(self)
                if self._watch is not None:
                    self._watch.start(self)
                self._reap()  # something may have exited before the handler existed
                self._run_loop()
                return self._finish()
            except BaseException:
                self.kill_now()
                stop_helpers()
                self._reap_after_kill()
                raise
            finally:
                if self._watch is not None:
                    self._watch.close()
                self._controller.close()
                self._watchdog.close()
                self._sigs.restore()
                self._sigs = None
                if previous_subreaper is not None and not previous_subreaper:
                    set_subreaper(False)
                route.close()  # a line said from now on goes to stderr
                self.printer.close_all()
                self.printer.finish(stall_s=OUTPUT_STALL_S, cap_s=OUTPUT_CAP_S)
                self._loop.close()  # last: the output threads wake the loop through it until they are done

    def _reap_after_kill(self) -> None:
        """After SIGKILL on an error path: collect the workers (bounded wait, never a hang)."""
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while self._live_count() and time.monotonic() < deadline:
            for worker in self.workers.values():
                if worker.alive:
                    with contextlib.suppress(ChildProcessError):
                        pid, status = os.waitpid(worker.pid, os.WNOHANG)
                        if pid:
                            worker.mark_reaped(status)
            if self._live_count():
                select.select([], [], [], 0.01)

    def _live_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.alive)

    def _run_loop(self) -> None:
        cleanup_started = False
        give_up_at: float | None = None
        while True:
            self._check_done()
            if self._live_count() == 0 and not self._controller.more_to_start():
                if not cleanup_started:
                    cleanup_started = True
                    stop_helpers()  # (a py-spy the hang's deadline gave up on: the reaper takes it now)
                    self._scan_leftovers()
                    if self._orphans.live:
                        self._stop_leftovers()
                if not self._orphans.live:
                    break
            if self._shutdown.killed:  # what outlives SIGKILL (D state: a rank stuck in the GPU driver) is given up
                give_up_at = give_up_at or time.monotonic() + LEFTOVER_WAIT_S
                if time.monotonic() >= give_up_at:
                    left = [f"{w.name} (pid {w.pid})" for w in self.workers.values() if w.alive]
                    pids = ", ".join(left + [str(p) for p in sorted(self._orphans.live)])
                    console.say(f"process(es) {pids} did not die after SIGKILL; giving up on them")
                    break
            self._round(self._next_timeout(give_up_at))

    def _round(self, timeout: float | None) -> None:
        """One turn of the loop: hand output to the sinks, wait for events, run what is due."""
        self.printer.flush()
        self._loop.set_paused(self.printer.congested)  # back-pressure: the sinks are behind
        for data in self._loop.wait(timeout):
            if data == "signals":
                self._on_signals(self._sigs.read() if self._sigs else [])
            elif not self.printer.read(data):
                self._close_stream(data)
        self._loop.run_due()
        if self._shutdown.due(time.monotonic()):
            alive = [w.name for w in self.workers.values() if w.alive] + [str(p) for p in self._orphans.live]
            if alive:
                console.say(f"grace period of {self._shutdown.grace_s:g} s over; SIGKILL to {', '.join(alive)}")
            self.kill_now()
            self._reap()

    def _next_timeout(self, give_up_at: float | None) -> float | None:
        first = self._loop.next_timer()
        deadlines = [first] if first is not None else []
        if (kill_at := self._shutdown.deadline()) is not None:
            deadlines.append(kill_at)
        if give_up_at is not None:
            deadlines.append(give_up_at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _on_signals(self, signums: list[int]) -> None:
        reap = False
        for signum in signums:
            if signum == signal.SIGCHLD:
                reap = True
            elif signum in PASSED_THROUGH:
                for worker in self.workers.values():
                    if worker.alive:
                        worker.signal_group(signum)
            elif signum in TERMINATING:
                self._on_terminating(signum)
        if reap:
            self._reap()

    def _on_terminating(self, signum: int) -> None:
        name = signal_name(signum)
        if self._shutdown.stopping and signum == signal.SIGINT and not self._shutdown.killed:
            console.say(f"second {name}: SIGKILL now")
            self.kill_now()
            self._reap()
            return
        if self._shutdown.stopping:
            self._shutdown.forward(self.workers.values(), signum)
            return
        if self._root is None and self._signal is None:
            self._signal = signum
        console.say(
            f"received {name}: forwarding it to {self._live_count()} worker(s); SIGKILL after {self.grace_s:g} s"
            + (" (Ctrl-C again to kill now)" if signum == signal.SIGINT else "")
        )
        self.stop(signum)

    def _reap(self) -> None:
        for worker in list(self.workers.values()):
            if not worker.alive:
                continue
            try:
                pid, status = os.waitpid(worker.pid, os.WNOHANG)
            except ChildProcessError:  # reaped behind our back: nothing better to report
                pid, status = worker.pid, 0
            if pid:
                self._on_worker_exit(worker, status)
        self._scan_leftovers()

    def _scan_leftovers(self) -> None:
        """Reap exited orphans; remember the job's live ones (and stop them at once during shutdown)."""
        fresh = self._orphans.scan({w.pid for w in self.workers.values()})
        if fresh and self._shutdown.stopping:  # orphaned by the shutdown itself (torchrun's workers): stop now
            sig = self._shutdown.current_signal
            console.say(f"{signal_name(sig)} to leftover process(es) of the job: {describe_pids(fresh)}")
            self._orphans.signal_all(sig, fresh)
            self._told_leftovers.update(fresh)

    def _stop_leftovers(self) -> None:
        untold = set(self._orphans.live) - self._told_leftovers
        if untold:
            console.say(f"stopping leftover process(es) of the job: {describe_pids(untold)}")
            self._told_leftovers.update(untold)
        if not self._shutdown.stopping:
            self.stop()
        else:
            self._orphans.signal_all(self._shutdown.current_signal)

    def _on_worker_exit(self, worker: Worker, status: int) -> None:
        worker.mark_reaped(status)
        stream = self.printer.streams.get(worker.name)
        # (while the sinks are behind, take only what the pipe holds now: its size bounds the memory)
        if (
            stream is not None
            and not stream.eof
            and stream.fd is not None
            and not self.printer.drain(stream, max_bytes=1 if self._loop.paused else 64 << 20)
        ):
            self._close_stream(stream)
        code = os.waitstatus_to_exitcode(status)
        failed = not worker.stopped_by_podguard and (code != 0 or worker.spec.service)
        if failed and self._root is None and self._signal is None:
            self._root = worker.name
            label = worker.spec.label or worker.name
            cause = self._cause_of_exit(worker, code)
            if worker.spec.service and code == 0:
                self._root_code = ExitCode.FAILURE
                self._root_detail = f"{label} (a service) exited with code 0 before the job finished"
            else:
                self._root_detail = f"{label} {describe_exit(self._exit_record(worker))}"
            if cause is not None:  # e.g. a fatal GPU fault on its GPU: the fault is the root cause, not the code
                self._root_code, text = cause
                self._root_detail = f"{text}; then {self._root_detail}"
            others = self._live_count()
            if self._fail_fast:  # (independent workers report their own failures: say nothing here)
                if others:  # (a lone worker's end is told once, by the summary)
                    stopping = f"; stopping the other {others} worker(s), SIGKILL after {self.grace_s:g} s"
                    console.say(self._root_detail + stopping)
                self.stop()
        self._controller.on_exit(self, worker)

    def _cause_of_exit(self, worker: Worker, code: int) -> tuple[int, str] | None:
        ask = getattr(self._watch, "cause_of_exit", None)
        if ask is None:
            return None
        try:
            return ask(tuple(worker.spec.gpus), code)
        except Exception:  # a watch's error must never hide the worker's own exit
            return None

    def _close_stream(self, stream: Stream) -> None:
        """EOF: unregister the fd first (its number may be reused at once), then flush and close."""
        if stream.fd is not None:
            self._loop.remove_reader(stream.fd)
        self.printer.close(stream)

    def _check_done(self) -> None:
        """Every non-service worker finished well and nothing is left to start: stop the services."""
        if self._shutdown.stopping or self._ended_ok or self._controller.more_to_start():
            return
        jobs = [w for w in self.workers.values() if not w.spec.service]
        services = [w for w in self.workers.values() if w.spec.service and w.alive]
        if jobs and services and not any(w.alive for w in jobs):
            self._ended_ok = True
            console.say(f"job finished; stopping service(s) {', '.join(w.name for w in services)}")
            self.stop()

    # -- the result -------------------------------------------------------------------------------
    def _exit_record(self, worker: Worker) -> WorkerExit:
        return worker.exit_record(self.printer.tail(worker.name), self.printer.first_error(worker.name))

    def _drain_pipes(self) -> None:
        """Read what is left in the pipes; a pipe an outsider holds open is given up after DRAIN_WAIT_S."""
        deadline = time.monotonic() + DRAIN_WAIT_S
        for stream in list(self.printer.open_streams()):
            while self.printer.read(stream):
                if time.monotonic() >= deadline or self.printer.backlog > DRAIN_BACKLOG_CAP:
                    break
                self.printer.flush()
                select.select([stream.fd], [], [], max(0.0, deadline - time.monotonic()))
            self._close_stream(stream)
        self.printer.close_all()

    def _finish(self) -> JobOutcome:
        self._drain_pipes()
        exits = tuple(self._exit_record(w) for w in self.workers.values())
        root = next((e for e in exits if e.name == self._root), None)
        if self._signal is not None:
            code = signal_exit_code(self._signal)
        elif self._root_code is not None:
            code = self._root_code
        elif root is not None:
            code = root.exit_code or ExitCode.FAILURE
        else:
            code = 0
        detail = job_detail(
            code=code,
            exits=exits,
            elapsed_s=time.monotonic() - self._started_at,
            signum=self._signal,
            root_detail=self._root_detail,
        )
        outcome = JobOutcome(exit_code=code, workers=exits, root_cause=root, signal=self._signal, detail=detail)
        if self._summary:
            console.say(format_summary(outcome), loud=True)
        return outcome

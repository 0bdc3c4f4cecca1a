"""The Manager: start workers, multiplex their output, watch them, fail fast, forward signals, reap.

honcho's Manager with tini's discipline, in one single-threaded event loop (no polling with sleeps):

* **Events**: one `selectors` loop over every worker's pipe, a `signal.set_wakeup_fd` pipe (the C-level
  signal handler writes the signal number there, so a signal wakes the loop at once and is handled in
  the loop, never inside a handler), and a pipe for calls from helper threads (roles' URL probes).
  Timers (the grace deadline, ready timeouts) set the select timeout. Must run in the main thread.
* **Fail fast**: the first worker that fails (non-zero exit, killed by a signal, or a *service* that
  exits at all) is the root cause. Every other worker's process group gets SIGTERM; whatever is still
  alive after the grace period gets SIGKILL. The job's exit code is the root cause's: its exit status,
  or 128+N when it was killed by signal N.
* **Signals**: SIGTERM, SIGINT and SIGHUP are forwarded, as the same signal, to every worker's process
  group (each worker has its own group, so it gets exactly one copy); after the grace period the rest
  is SIGKILLed and the job exits 128+N (N = the signal podguard got). A second SIGINT (Ctrl-C twice)
  SIGKILLs at once. SIGUSR1/SIGUSR2 are forwarded without stopping anything (checkpoint-on-signal).
* **Grace period** `DEFAULT_GRACE_S = 7` s: `docker stop` (and RunPod's stop) sends SIGTERM and
  SIGKILLs the container 10 s later. 7 s for the workers to save and exit, then SIGKILL and the
  cleanup of leftovers, leaves podguard ~3 s to reap, record the outcome and exit on its own terms —
  so the exit code and the outcome record survive instead of the whole container being killed.
* **Reaping, subreaper**: podguard makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so any
  descendant whose parent dies (torchrun's workers, which torchrun starts in their own sessions; a
  worker's dataloader processes; double-forked daemons) is re-parented to podguard instead of to PID 1.
  Every such child is reaped (no zombies, also when podguard is PID 1 in a container), and at the end
  of the job the ones still alive are stopped (SIGTERM, then SIGKILL at the grace deadline): they would
  otherwise hold GPU memory that the next run's preflight has to fight for. Children the calling
  process had *before* the job started are never touched (library use, tests). The subreaper flag,
  signal handlers and wakeup fd are restored when `run()` returns.
* **Services** (`WorkerSpec.service`, used by roles): long-running helpers such as an inference server.
  The job is done when every non-service worker has finished successfully; services are then stopped
  and do not affect the exit code. A service that exits on its own before that is a failure.

The result is a `JobOutcome`: exit code, every worker's `WorkerExit` (with its last lines), the root
cause, the signal podguard got, and `detail` — a short human summary naming the GPU/rank, its code or
signal and its last log lines (also printed at the end unless `summary=False`).
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import os
import queue
import select
import selectors
import signal
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import BinaryIO, TextIO

from podguard.errors import UsageError, signal_exit_code
from podguard.launch.printer import LineCallback, Printer, Stream
from podguard.launch.process import JOB_ID_ENV, Worker, child_env, resolve_program, start_worker
from podguard.launch.spec import JobOutcome, WorkerExit, WorkerSpec

DEFAULT_GRACE_S = 7.0  # fits inside Docker's default 10 s stop timeout; see the module docstring
LEFTOVER_WAIT_S = 2.0  # after SIGKILL, how long to wait for the kernel to reap stragglers (D state)
DRAIN_WAIT_S = 0.5  # after everything exited, how long a pipe may stay open (held by an outsider)
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PASSED_THROUGH = (signal.SIGUSR1, signal.SIGUSR2)

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


# --------------------------------------------------------------------------------------------------
# Small OS helpers


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_subreaper(on: bool) -> bool | None:
    """Set PR_SET_CHILD_SUBREAPER; returns the previous value (None where prctl is unavailable)."""
    libc = _libc()
    if libc is None:
        return None
    previous = ctypes.c_int(0)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        return None
    return bool(previous.value)


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is `pid`, zombies included (from /proc: `task/*/children` or every stat)."""
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
        with open(f"{task_dir}/{tids[0]}/children") as fh:
            first = fh.read()
    except (OSError, IndexError):
        first = None
    if first is not None:  # CONFIG_PROC_CHILDREN: exact and cheap
        found = [int(p) for p in first.split()]
        for tid in tids[1:]:
            with contextlib.suppress(OSError), open(f"{task_dir}/{tid}/children") as fh:
                found.extend(int(p) for p in fh.read().split())
        return found
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split(b" ", 2)
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def describe_exit(exit: WorkerExit) -> str:
    """'exited with code 3' / 'was killed by SIGKILL (signal 9)' plus a hint where one helps."""
    if exit.signal is not None:
        text = f"was killed by {signal_name(exit.signal)} (signal {exit.signal})"
        if exit.signal == signal.SIGKILL and not exit.stopped_by_podguard:
            text += " — not sent by podguard: often the out-of-memory killer (see `dmesg`)"
        elif exit.signal == signal.SIGSEGV:
            text += " — a crash in native code"
        return text
    return f"exited with code {exit.returncode}"


# --------------------------------------------------------------------------------------------------
# Signals


class _Signals:
    """Route signals into the event loop through a wakeup fd; restore everything afterwards."""

    HANDLED = (*TERMINATING, *PASSED_THROUGH, signal.SIGCHLD)

    def __init__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("podguard's supervisor must run in the main thread (it handles signals)")
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self._old_handlers = {sig: signal.getsignal(sig) for sig in self.HANDLED}
        for sig in self.HANDLED:
            signal.signal(sig, self._noop)
        self._old_wakeup = signal.set_wakeup_fd(self.wfd, warn_on_full_buffer=False)

    @staticmethod
    def _noop(signum: int, frame: object) -> None:
        """The real work happens in the loop, which the wakeup fd woke up."""

    def read(self) -> list[int]:
        got: list[int] = []
        while True:
            try:
                data = os.read(self.rfd, 4096)
            except BlockingIOError:
                return got
            if not data:
                return got
            got.extend(data)

    def restore(self) -> None:
        signal.set_wakeup_fd(self._old_wakeup)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        os.close(self.rfd)
        os.close(self.wfd)


# --------------------------------------------------------------------------------------------------
# The supervisor


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


@dataclass
class _Timer:
    when: float
    fn: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Supervisor:
    """Runs one job. Use `run_job()` for the common case; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        out: BinaryIO | TextIO | int | None = None,
        only: Collection[str] | None = None,
        on_line: LineCallback | None = None,
        tail_lines: int = 20,
        pdeathsig: int | None = signal.SIGTERM,
        subreaper: bool = True,
        summary: bool = True,
    ) -> None:
        if not grace_s >= 0:
            raise UsageError(f"grace period {grace_s!r} s is not valid; expected a number of seconds >= 0")
        self.grace_s = float(grace_s)
        self.printer = Printer(out, only=only, on_line=on_line, tail_lines=tail_lines)
        self.workers: dict[str, Worker] = {}
        self._pdeathsig = pdeathsig
        self._subreaper = subreaper
        self._summary = summary
        self._sel = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._call_r, self._call_w = os.pipe()
        os.set_blocking(self._call_r, False)
        os.set_blocking(self._call_w, False)
        self._preexisting: set[int] = set()
        self._pid1 = os.getpid() == 1
        self.job_id = f"{os.getpid()}-{time.time_ns()}"
        self._outsiders: set[int] = set()  # PID 1 only: orphans that are not the job's
        self._leftovers: dict[int, float] = {}  # orphan pid -> when first seen
        self._stopping = False  # SIGTERM was sent; SIGKILL at _kill_at
        self._kill_at: float | None = None
        self._killed = False  # SIGKILL was sent
        self._signal: int | None = None  # the terminating signal podguard received first
        self._root: str | None = None  # name of the root-cause worker
        self._root_code: int | None = None  # exit code override (service exited 0, ready timeout)
        self._root_detail = ""
        self._ended_ok = False  # every non-service worker finished successfully
        self._started_at = time.monotonic()
        self.started_wall = time.time()
        self._sigs: _Signals | None = None
        self._controller = Controller()
        self._running = False

    # -- API used by controllers (roles) ----------------------------------------------------------
    def start(self, spec: WorkerSpec) -> Worker:
        """Start a worker now (before or during `run()`)."""
        if spec.name in self.workers:
            raise UsageError(f"two workers are named {spec.name!r}; worker names must be unique")
        worker = start_worker(spec, pdeathsig=self._pdeathsig, job_id=self.job_id)
        self.workers[spec.name] = worker
        stream = self.printer.add(spec.name, worker.fd, prefix=spec.prefix, log_path=spec.log_path)
        self._sel.register(worker.fd, selectors.EVENT_READ, stream)
        if self._stopping:  # started during shutdown (a race in a controller): stop it too
            worker.stopped_by_podguard = True
            worker.signal_group(signal.SIGKILL if self._killed else signal.SIGTERM)
        return worker

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer(time.monotonic() + max(0.0, delay), fn)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def call_from_thread(self, fn: Callable[[], None]) -> None:
        """Run `fn` in the loop's thread soon; safe to call from any thread."""
        self._calls.put(fn)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._call_w, b"\0")

    def message(self, text: str) -> None:
        """A podguard line in the output, in order with the workers' lines."""
        for line in text.splitlines() or [""]:
            self.printer.message(f"podguard: {line}")

    def fail(self, worker: str | None, code: int, detail: str) -> None:
        """Declare the job failed (e.g. a role that never became ready) and stop everything."""
        if self._root is None and not self._stopping:
            self._root = worker
            self._root_code = code
            self._root_detail = detail
            self.message(f"{detail}; stopping {self._live_count()} worker(s)")
        self.stop()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Begin the shutdown: `signum` to every live worker's group now, SIGKILL after the grace."""
        if self._stopping:
            return
        self._stopping = True
        self._kill_at = time.monotonic() + self.grace_s
        for worker in self.workers.values():
            if worker.alive:
                worker.stopped_by_podguard = True
                worker.signal_group(signum)
        for pid in self._leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)

    def kill_now(self) -> None:
        """SIGKILL every live worker group and every leftover child."""
        self._stopping = True
        self._killed = True
        self._kill_at = time.monotonic()
        for worker in self.workers.values():
            if worker.alive:
                worker.stopped_by_podguard = True
            worker.signal_group(signal.SIGKILL)  # exited leaders: their group may live on
        for pid in self._leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, controller: Controller | None = None) -> JobOutcome:
        """Run until every worker (and every leftover descendant) is gone; return the outcome."""
        if controller is not None:
            self._controller = controller
        self._preexisting = set(children_of(os.getpid())) - {w.pid for w in self.workers.values()}
        previous_subreaper = set_subreaper(True) if self._subreaper else None
        self._sigs = _Signals()
        self._sel.register(self._sigs.rfd, selectors.EVENT_READ, "signals")
        self._sel.register(self._call_r, selectors.EVENT_READ, "calls")
        self._running = True
        try:
            self._controller.on_start(self)
            self._reap()  # something may have exited before the handler existed
            self._loop()
            return self._finish()
        except BaseException:
            self.kill_now()
            self._reap_after_kill()
            raise
        finally:
            self._running = False
            self._controller.close()
            self._sigs.restore()
            self._sigs = None
            if previous_subreaper is not None and not previous_subreaper:
                set_subreaper(False)
            self._sel.close()
            for fd in (self._call_r, self._call_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.printer.close_all()

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

    def _loop(self) -> None:
        cleanup_started = False
        give_up_at: float | None = None
        while True:
            self._check_done()
            workers_done = self._live_count() == 0 and not self._controller.more_to_start()
            if workers_done:
                if not cleanup_started:
                    cleanup_started = True
                    self._scan_leftovers()
                    if self._leftovers:
                        self._stop_leftovers()
                if not self._leftovers:
                    break
                if self._killed:
                    give_up_at = give_up_at or time.monotonic() + LEFTOVER_WAIT_S
                    if time.monotonic() >= give_up_at:
                        pids = ", ".join(str(p) for p in sorted(self._leftovers))
                        self.message(f"leftover process(es) {pids} did not die after SIGKILL; giving up on them")
                        break
            timeout = self._next_timeout(give_up_at)
            self.printer.flush()
            for key, _ in self._sel.select(timeout):
                data = key.data
                if data == "signals":
                    self._on_signals(self._sigs.read() if self._sigs else [])
                elif data == "calls":
                    self._run_calls()
                elif not self.printer.read(data):
                    self._close_stream(data)
            self._run_timers()
            if self._kill_at is not None and not self._killed and time.monotonic() >= self._kill_at:
                alive = [w.name for w in self.workers.values() if w.alive] + [str(p) for p in self._leftovers]
                if alive:
                    self.message(f"grace period of {self.grace_s:g} s over; SIGKILL to {', '.join(alive)}")
                self.kill_now()
                self._reap()

    def _next_timeout(self, give_up_at: float | None) -> float | None:
        deadlines = [t[0] for t in self._timers[:1]]
        if self._kill_at is not None and not self._killed:
            deadlines.append(self._kill_at)
        if give_up_at is not None:
            deadlines.append(give_up_at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.fn()

    def _run_calls(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._call_r, 4096):
                pass
        while True:
            try:
                fn = self._calls.get_nowait()
            except queue.Empty:
                return
            fn()

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
        if self._stopping and signum == signal.SIGINT and not self._killed:
            self.message(f"second {name}: SIGKILL now")
            self.kill_now()
            self._reap()
            return
        if self._stopping:  # exact forwarding: pass it on again, the grace deadline stays
            for worker in self.workers.values():
                if worker.alive:
                    worker.signal_group(signum)
            return
        if self._root is None and self._signal is None:
            self._signal = signum
        live = self._live_count()
        self.message(
            f"received {name}: forwarding it to {live} worker(s); SIGKILL after {self.grace_s:g} s"
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
        """Reap exited orphans; remember the job's live ones (and stop them at once during shutdown).

        As a subreaper, every orphan that comes to podguard descends from the job. As PID 1 in a
        container every orphan in the container comes here (a process left by an SSH session, say):
        all of them are reaped, but only those carrying this job's PODGUARD_JOB_ID are stopped.
        Children that existed before the job are never stopped (and only reaped when PID 1).
        """
        workers = {w.pid for w in self.workers.values()}
        now = time.monotonic()
        alive: dict[int, float] = {}
        for pid in children_of(os.getpid()):
            preexisting = pid in self._preexisting
            if pid in workers or (preexisting and not self._pid1):
                continue
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if reaped or preexisting or not self._is_job_process(pid):
                continue
            alive[pid] = self._leftovers.get(pid, now)
        fresh = sorted(set(alive) - set(self._leftovers))
        self._leftovers = alive
        if fresh and self._stopping:  # orphaned by the shutdown itself (torchrun's workers): stop now
            sig = signal.SIGKILL if self._killed else signal.SIGTERM
            self.message(f"{signal_name(sig)} to leftover process(es) of the job: {_describe_pids(fresh)}")
            for pid in fresh:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)

    def _is_job_process(self, pid: int) -> bool:
        if not self._pid1 or pid in self._leftovers:
            return True
        if pid in self._outsiders:
            return False
        marker = f"{JOB_ID_ENV}={self.job_id}".encode()
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                ours = marker in fh.read().split(b"\0")
        except OSError:
            ours = True  # unreadable (exiting): treat it as the job's, the cautious side for GPU memory
        if not ours:
            self._outsiders.add(pid)
        return ours

    def _stop_leftovers(self) -> None:
        self.message(f"stopping leftover process(es) of the job: {_describe_pids(self._leftovers)}")
        if not self._stopping:
            self.stop()
        else:
            for pid in self._leftovers:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL if self._killed else signal.SIGTERM)

    def _on_worker_exit(self, worker: Worker, status: int) -> None:
        worker.mark_reaped(status)
        stream = self.printer.streams.get(worker.name)
        if stream is not None and not stream.eof and stream.fd is not None and not self.printer.drain(stream):
            self._close_stream(stream)
        code = os.waitstatus_to_exitcode(status)
        failed = not worker.stopped_by_podguard and (code != 0 or worker.spec.service)
        if failed and self._root is None and self._signal is None:
            self._root = worker.name
            exit_ = self._exit_record(worker)
            label = worker.spec.label or worker.name
            if worker.spec.service and code == 0:
                self._root_code = 1
                self._root_detail = f"{label} (a service) exited with code 0 before the job finished"
            else:
                self._root_detail = f"{label} {describe_exit(exit_)}"
            others = self._live_count()
            self.message(
                self._root_detail
                + (f"; stopping the other {others} worker(s), SIGKILL after {self.grace_s:g} s" if others else "")
            )
            self.stop()
        self._controller.on_exit(self, worker)

    def _close_stream(self, stream: Stream) -> None:
        """EOF: unregister the fd first (its number may be reused at once), then flush and close."""
        if stream.fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(stream.fd)
        self.printer.close(stream)

    def _check_done(self) -> None:
        """Every non-service worker finished well and nothing is left to start: stop the services."""
        if self._stopping or self._ended_ok or self._controller.more_to_start():
            return
        jobs = [w for w in self.workers.values() if not w.spec.service]
        services = [w for w in self.workers.values() if w.spec.service and w.alive]
        if jobs and services and not any(w.alive for w in jobs):
            self._ended_ok = True
            names = ", ".join(w.name for w in services)
            self.message(f"job finished; stopping service(s) {names}")
            self.stop()

    # -- the result -------------------------------------------------------------------------------
    def _exit_record(self, worker: Worker) -> WorkerExit:
        code = os.waitstatus_to_exitcode(worker.status) if worker.status is not None else None
        return WorkerExit(
            name=worker.name,
            pid=worker.pid,
            returncode=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            tail=self.printer.tail(worker.name),
            stopped_by_podguard=worker.stopped_by_podguard,
        )

    def _finish(self) -> JobOutcome:
        deadline = time.monotonic() + DRAIN_WAIT_S
        for stream in list(self.printer.open_streams()):
            while self.printer.read(stream):
                if time.monotonic() >= deadline:
                    break  # an outsider holds the pipe open: do not wait for it
                self.printer.flush()
                select.select([stream.fd], [], [], max(0.0, deadline - time.monotonic()))
            self._close_stream(stream)
        self.printer.close_all()
        exits = tuple(self._exit_record(w) for w in self.workers.values())
        root = next((e for e in exits if e.name == self._root), None)
        if self._signal is not None:
            code = signal_exit_code(self._signal)
        elif self._root_code is not None:
            code = self._root_code
        elif root is not None:
            code = root.exit_code or 1
        else:
            code = 0
        detail = self._detail(code, exits, root)
        outcome = JobOutcome(exit_code=code, workers=exits, root_cause=root, signal=self._signal, detail=detail)
        if self._summary:
            self.message(format_summary(outcome))
            self.printer.flush()
        return outcome

    def _detail(self, code: int, exits: Sequence[WorkerExit], root: WorkerExit | None) -> str:
        elapsed = time.monotonic() - self._started_at
        killed = [e.name for e in exits if e.stopped_by_podguard and e.signal == signal.SIGKILL]
        stopped = f"; {len(killed)} needed SIGKILL after the grace period ({', '.join(killed)})" if killed else ""
        if self._signal is not None:
            return (
                f"podguard received {signal_name(self._signal)} after {elapsed:.1f} s and stopped "
                f"{len(exits)} worker(s){stopped}; exit {code}"
            )
        if self._root_detail:
            return f"{self._root_detail}; exit {code}{stopped}"
        services = [e.name for e in exits if e.stopped_by_podguard]
        stopped = f"; then stopped the service(s) {', '.join(services)}" if services else ""
        return f"job finished successfully in {elapsed:.1f} s ({len(exits)} worker(s){stopped})"


def _describe_pids(pids: Collection[int]) -> str:
    return ", ".join(f"{pid} ({_comm(pid)})" for pid in sorted(pids))


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def format_summary(outcome: JobOutcome, *, lines: int = 20) -> str:
    """The human summary: one line, plus the root cause's last log lines when the job failed."""
    text = outcome.detail or f"job exited {outcome.exit_code}"
    root = outcome.root_cause
    if outcome.exit_code != 0 and root is not None and root.tail:
        tail = root.tail[-lines:]
        text += f"\nlast {len(tail)} line(s) of {root.name}:\n" + "\n".join(f"  | {line}" for line in tail)
    return text


def check_specs(specs: Sequence[WorkerSpec]) -> None:
    """Validate before anything starts: unique names, runnable programs (UsageError otherwise)."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise UsageError(f"two workers are named {spec.name!r}; worker names must be unique")
        seen.add(spec.name)
        resolve_program(spec, child_env(spec))


class _StartAll(Controller):
    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.specs = specs

    def on_start(self, sup: Supervisor) -> None:
        for spec in self.specs:
            if sup.stopping:  # a signal arrived while starting: do not start the rest
                break
            sup.start(spec)


def run_job(
    specs: Sequence[WorkerSpec],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    out: BinaryIO | TextIO | int | None = None,
    only: Collection[str] | None = None,
    on_line: LineCallback | None = None,
    tail_lines: int = 20,
    summary: bool = True,
) -> JobOutcome:
    """Start every spec at once and supervise the job to its end (fail fast, signals, reaping).

    `out`: where prefixed lines go (default stdout); `only`: worker names shown there (all still go to
    their log files); `on_line(name, line)`: called for every line (costs a Python call per line).
    Raises `UsageError` (exit 64) before starting anything when a spec cannot run.
    """
    if not specs:
        raise UsageError("nothing to run: no worker was given")
    check_specs(specs)
    names = {s.name for s in specs}
    if only is not None:
        unknown = sorted(set(only) - names)
        if unknown:
            raise UsageError(f"cannot show only {unknown}: no such worker; workers are {', '.join(sorted(names))}")
    sup = Supervisor(grace_s=grace_s, out=out, only=only, on_line=on_line, tail_lines=tail_lines, summary=summary)
    return sup.run(_StartAll(specs))

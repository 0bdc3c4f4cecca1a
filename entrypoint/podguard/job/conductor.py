"""The lifecycle of one `podguard train|run`: configure -> attempt -> preflight -> launch -> watch -> outcome ->
restart or end. The CLI's one call:

    code = conduct(["python", "train.py"], launch_options, preflight_opts, demo=False)

0. every check of the options and the environment (job/configure.py: 64 before anything runs), then what the run
   opens before anything starts: the metrics port and file, the billing guards, the checkpoint store;
1. the restart guard: a restarted container does not re-run a finished job nor crash-loop (job/restart_guard.py);
   a budget already spent ends it here (guards/);
2. each attempt: a fresh preflight (cleanup, selection, the gate; the GPUs stay leased from the first attempt
   on), on a multi-node run the cluster gate (all nodes launch or none: job/multinode.py), then the workers under
   supervision, the billing guards and the run-time watch (job/attempt.py); with `--checkpoints` the newest
   whole checkpoint is handed to each attempt (job/handoff.py);
3. the outcome: success, a signal or a tripped guard end the job; a crash, a hang (79) or a GPU fault (76) is
   relaunched while `--restarts` allow and no crash loop is seen (job/restarts.py; a new whole checkpoint is
   progress), after an announced pause;
4. the END line, exactly once, around the whole run (job/ending.py; with `--checkpoints` it names the checkpoint the
   last attempt started from and the newest at its end), then `--on-exit` (or, when a guard ended the job, stop
   this pod / 124). A PodguardError ends the command: its END line, its one-line error, its exit code.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.errors import ExitCode, PodguardError, signal_exit_code
from podguard.gpu.selected import Selection
from podguard.guards import open_guards
from podguard.job import restart_guard
from podguard.job.attempt import AttemptResult, run_attempt
from podguard.job.configure import configure_counted
from podguard.job.ending import Ending, EndOfRun
from podguard.job.handoff import Handoff
from podguard.job.multinode import pass_cluster_gate, worker_socket_env
from podguard.job.options import JobOptions, JobSettings
from podguard.job.restarts import Failure, FailureKind, RestartPolicy, made_progress
from podguard.job.store import StoreSync, open_store_sync, store_series
from podguard.launch.config import JobConfig, LaunchMode, OnExit
from podguard.metrics import open_metrics
from podguard.outcome_lines import EndKind, restart_line
from podguard.pause import next_signal, signals_held
from podguard.preflight.options import PreflightOptions
from podguard.preflight.pipeline import PreflightResult, run_preflight
from podguard.redact import redact_command
from podguard.state import state_dir

if TYPE_CHECKING:
    from podguard.guards import GuardWatch
    from podguard.job.handoff import AttemptCheckpoints
    from podguard.metrics import Metrics
    from podguard.pods.selfheal import SelfHealConfig
    from podguard.preflight.leases import GpuLease

__all__ = ["Conductor", "conduct", "run_job"]


def conduct(argv: list[str], options: JobOptions, opts: PreflightOptions, *, demo: bool = False) -> int:
    """`podguard train|run`, whole: the module docstring's steps with exactly one END line; the exit code."""
    end = EndOfRun(opts.command)
    try:  # (the END line comes before what the run held is closed: `held` closes last)
        with ExitStack() as held, end.around():
            settings = configure_counted(argv, options, opts, demo=demo)
            base = state_dir(opts.state_dir)
            end.started = True
            return run_job(settings, opts, base, end, held)
    except PodguardError as exc:
        console.error(exc.message)
        return exc.code


def run_job(settings: JobSettings, opts: PreflightOptions, base: Path, end: EndOfRun, held: ExitStack) -> int:
    """Open what the run holds (metrics, guards, the store: a taken port or a missing bucket is 64 here, before
    anything runs; each is closed by `held`, the store first), then run the lifecycle."""
    cfg = settings.launch
    metrics = _open_metrics(settings)  # --metrics-port/--metrics-file: a taken port is exit 64
    if metrics is not None:
        held.callback(metrics.close)  # the port closes; the file keeps its last values
    guards = _open_guards(settings)  # --max-cost reads this pod's cost/hr and start from the API, once
    if guards is not None:
        held.callback(guards.close)
    if metrics is not None:
        metrics.read_price(guards)  # inside a pod: its price (the cost guard's read, else one of its own)
    # --checkpoint-store: no such bucket or refused credentials are exit 64 before anything runs (job/store.py)
    publish = (lambda _stats: metrics.refresh()) if metrics is not None else None
    store = open_store_sync(settings.checkpoints, publish, nnodes=cfg.options.nnodes, node_rank=cfg.options.node_rank)
    if store is not None:
        held.callback(store.close)
        if metrics is not None:
            metrics.add_source(lambda: store_series(store.mirror.stats()))
    return Conductor(settings, opts, base, end, guards, metrics=metrics, store=store).run()


class Conductor:
    """One job's lifecycle; `run()` is the loop of the module docstring."""

    def __init__(
        self,
        settings: JobSettings,
        opts: PreflightOptions,
        base: Path,
        end: EndOfRun,
        guards: GuardWatch | None,
        *,
        metrics: Metrics | None = None,
        store: StoreSync | None = None,
    ) -> None:
        cfg = settings.launch
        self.settings = settings
        self.cfg = cfg
        self.base = base
        self.end_of_run = end  # the END line: said once, by `end()` or (an error) around the run
        self.heal = settings.self_heal
        self.guards = guards
        self.metrics = metrics
        self.opts = replace(
            opts,
            lease=True,
            extra={**opts.extra, "command_line": f"podguard {opts.command} -- {redact_command(cfg.argv)}"},
        )
        self.command = opts.command
        self.key = restart_guard.job_key(cfg.job_argv, cfg.mode, extra=[os.environ.get("GPU_LIST", "")])
        self.policy = RestartPolicy(settings.restarts)
        self.lease: GpuLease | None = None
        self.faulted: dict[str, tuple[str, str]] = {}  # GPUs with a fatal fault in an attempt: unhealthy from then on
        self.record: Callable[..., Path | None] | None = None
        self.handoff = _handoff(settings)  # --checkpoints: the newest whole checkpoint handed to each attempt
        self.store = store  # --checkpoint-store: restored before each attempt, mirrored during it
        if self.handoff is not None:
            self.handoff.store = store
        self.seen: AttemptCheckpoints | None = None  # the last attempt's checkpoints (END and RESTART name them)

    @property
    def attempts(self) -> int:
        return self.end_of_run.attempts

    @attempts.setter
    def attempts(self, value: int) -> None:
        self.end_of_run.attempts = value

    # -- the lifecycle ----------------------------------------------------------------------------------------
    def run(self) -> int:
        early = self.restart_guard()
        if early is not None:
            return early
        try:
            return self.attempts_until_the_end()
        except PodguardError as exc:  # a bad command, a failed prepare step, a port conflict: it counts too
            self._record_start(exc.code, exc.message, type(exc).__name__)
            raise
        finally:
            if self.lease is not None:
                self.lease.release()

    def attempts_until_the_end(self) -> int:
        gate = self.settings.gate  # multi-node: checked by configure()
        socket_env, notes = worker_socket_env()  # NCCL/GLOO_SOCKET_IFNAME from NODE_ADDR
        for attempt in itertools.count():
            self.attempts = attempt + 1
            pre = self.preflight(attempt)
            passed = pass_cluster_gate(gate, pre, notes, self.base) if gate is not None else None  # every node
            if pre.exit_code != ExitCode.OK:
                return self.preflight_failed(pre)
            _self_heal(self.heal, ExitCode.OK, self.base, pre.report_path)  # a pass resets the failure count
            if passed is not None and not passed.launch:  # another node failed or did not come: nobody launches
                detail = passed.detail or "cluster gate"
                stopped = self._record_start(passed.code, detail, "cluster gate")
                return self.end(Ending(EndKind.PREFLIGHT, passed.code, detail, stopped))
            if passed is None and attempt == 0:
                for note in notes:
                    console.say(note)
            assert pre.selection is not None
            result = run_attempt(
                self.settings,
                self.opts,
                pre.selection,
                self.base,
                self.key,
                socket_env,
                self.guards,
                attempt=attempt,
                metrics=self.metrics,
                handoff=self.handoff,
            )
            self.seen = result.checkpoints
            for fault in result.runtime.faults:
                if fault.fatal:
                    self.faulted.setdefault(fault.uuid or f"index:{fault.index}", (fault.kind, fault.text))
            failure = self.failure_of(result)
            if failure is None:
                return self.end(self.ending_of(result))
            decision = self.policy.after(failure)
            if not decision.restart:
                if self.settings.restarts:
                    console.say(f"not restarting: {decision.reason}", loud=True)
                return self.end(self.ending_of(result, failure))
            got = self.pause(attempt + 1, decision.delay_s, failure)
            if got is not None:
                return self.end(Ending(EndKind.SIGNAL, signal_exit_code(got), "a signal during the restart pause"))
        raise AssertionError("unreachable")

    def restart_guard(self) -> int | None:
        """A restarted container: back off, skip a finished job, or go on (None). A spent budget ends here."""
        decision = restart_guard.plan_launch(self.key, rerun=self.settings.rerun, state=self.base)
        if decision.delay_s > 0:
            got = restart_guard.backoff_wait(decision)
            if got is not None:
                return signal_exit_code(got)
        if self.guards is not None and (trip := self.guards.check(time.monotonic())) is not None:
            from podguard.guards.end import end_after_trip  # noqa: PLC0415  lazy: ends this pod's billing (pods.thispod.billing loads pods.actions, pods.placement), only when a guard trips

            return end_after_trip(trip)
        # every exit from here on is recorded (best-effort), so that a restart loop backs off whatever failed;
        # the clock starts after the pause, or long pauses would make quick crashes look slow
        self.record = partial(
            restart_guard.record_run,
            key=self.key,
            argv=self.cfg.job_argv,
            mode=self.cfg.mode,
            started_at=time.time(),
            state=self.base,
        )
        if decision.action is restart_guard.LaunchAction.SKIP:
            return self.skip(decision)
        return None

    def skip(self, decision: restart_guard.LaunchDecision) -> int:
        assert self.record is not None
        if not decision.delay_s:
            console.say(decision.reason)
        skipped = self.record(exit_code=ExitCode.OK, kind=restart_guard.RunKind.SKIP)
        self.attempts = 0
        ending = Ending(EndKind.SUCCESS, ExitCode.OK, "finished before (not run again)", skipped or decision.record)
        return self.end(ending)

    def preflight(self, attempt: int) -> PreflightResult:
        """Cleanup, selection and the gate; on the first attempt the GPUs are leased, later ones keep them."""
        if attempt:
            console.say(f"attempt {attempt + 1}: a fresh preflight (cleanup and the gate) before the relaunch")
        pre = run_preflight(
            self.opts, validate_selection=_selection_check(self.cfg), held=self.lease, faulted=self.faulted
        )
        if pre.lease is not None:
            self.lease = pre.lease
        return pre

    def preflight_failed(self, pre: PreflightResult) -> int:
        failed = self._record_start(pre.exit_code, pre.message, "preflight")
        healed = _self_heal(self.heal, pre.exit_code, self.base, pre.report_path)  # may restart/replace/park the pod
        if healed != pre.exit_code:
            return healed
        return self.end(Ending(EndKind.PREFLIGHT, pre.exit_code, "", failed))  # its summary said why

    def failure_of(self, result: AttemptResult) -> Failure | None:
        """What a relaunch would answer, or None when the attempt ended the job (success, signal, guard)."""
        outcome, watch = result.outcome, result.runtime
        if result.code == ExitCode.OK or outcome.signal is not None:
            return None
        if self.guards is not None and self.guards.tripped is not None:
            return None
        progress = watch.progress
        saved = result.checkpoints is not None and result.checkpoints.saved  # a new whole checkpoint is progress
        progressed = made_progress(
            matched=progress.matched,
            beating=progress.beating,
            watched=progress.pattern is not None or progress.beating,
            duration_s=result.duration_s,
            saved=saved,
        )
        if watch.hang is not None and result.code == ExitCode.HUNG:
            what = f"ranks {','.join(map(str, watch.hang.ranks))}" if watch.hang.ranks else "no progress"
            # an attempt that hung before its first line or heartbeat made no progress, however long it ran
            return Failure(result.code, FailureKind.HANG, what, (progressed and progress.seen) or saved)
        fatal = [f for f in watch.faults if f.fatal]
        if fatal and result.code == ExitCode.GPU_UNHEALTHY:
            first = fatal[0]
            what = f"GPU {first.index} " + (f"Xid {first.xid}" if first.xid is not None else first.kind)
            return Failure(result.code, FailureKind.GPU_FAULT, what, progressed)
        return Failure(result.code, FailureKind.CRASH, "", progressed)  # the exit code tells one crash from another

    def pause(self, number: int, delay_s: float, failure: Failure) -> int | None:
        """Announce the relaunch and wait for it; a terminating signal ends the wait (its number)."""
        line = restart_line(self.command, number, self.settings.restarts, delay_s, failure.text, failure.code)
        console.line(line + (f"; {self.fragment()}" if self.seen is not None else ""), loud=True)  # a record
        with signals_held() as watched:
            got = next_signal(watched, delay_s)
        if got is not None:
            console.say(f"received {signal.Signals(got).name} during the restart pause; not relaunching", loud=True)
        return got

    def ending_of(self, result: AttemptResult, failure: Failure | None = None) -> Ending:
        outcome = result.outcome
        if self.guards is not None and self.guards.tripped is not None:
            trip = self.guards.tripped  # (its own line, next, says why and what it does about the pod)
            return Ending(EndKind.GUARD, ExitCode.BILLING_GUARD, trip.guard, result.record)
        if outcome.signal is not None:
            kind = EndKind.SIGNAL
        elif result.code == ExitCode.OK:
            kind = EndKind.SUCCESS
        elif failure is not None:
            kind = FailureKind(failure.kind).end_kind  # failed | hung | gpu-fault
        else:
            kind = EndKind.FAILED
        return Ending(kind, result.code, result.explained, result.record)  # the summary said the rest already

    def end(self, ending: Ending) -> int:
        """The END line, then what comes after the job: a guard stops the pod (or 124), else `--on-exit`."""
        if self.store is not None and ending.kind not in (
            EndKind.GUARD,
            EndKind.SIGNAL,
        ):  # (a guard's save waited already)
            assert self.settings.checkpoints is not None  # (a store needs --checkpoints)
            self.store.flush(self.settings.checkpoints.save_grace_s)  # the newest checkpoint reaches the store first
        detail = ending.detail
        if self.seen is not None:  # first: the END line is cut at its end, and `pod keep` reads this fragment
            detail = f"{self.fragment()}; {detail}" if detail else self.fragment()
        self.end_of_run.say(ending.kind, ending.code, detail)
        if ending.kind == EndKind.GUARD and self.guards is not None and self.guards.tripped is not None:
            from podguard.guards.end import end_after_trip  # noqa: PLC0415  lazy: ends this pod's billing (pods.thispod.billing loads pods.actions, pods.placement), only when a guard trips

            return end_after_trip(self.guards.tripped)
        return _after(self.settings.on_exit, ending.code, ending.record, self.guards)

    # -- helpers ----------------------------------------------------------------------------------------------
    def fragment(self) -> str:
        """The checkpoints' part of RESTART and END: the local ones, then the store's newest (with a store)."""
        assert self.seen is not None
        if self.store is None:
            return self.seen.fragment()
        return f"{self.seen.fragment()}; {self.store.fragment()}"

    def _record_start(self, code: int, detail: str, root_cause: str) -> Path | None:
        if self.record is None:
            return None
        return self.record(exit_code=code, kind=restart_guard.RunKind.START, detail=detail, root_cause=root_cause)


def _open_metrics(settings: JobSettings) -> Metrics | None:
    m = settings.metrics
    if m is None:
        return None
    return open_metrics(port=m.port, path=m.path, mode=str(settings.launch.mode), every_s=m.every_s)


def _handoff(settings: JobSettings) -> Handoff | None:
    if settings.checkpoints is None:
        return None
    return Handoff(settings.checkpoints.folder)


def _open_guards(settings: JobSettings) -> GuardWatch | None:
    if settings.guards is None:
        return None
    return open_guards(settings.guards)


def _selection_check(cfg: JobConfig) -> Callable[[Selection], None]:
    """Checks that need the selection (the roles GPU split); the preflight runs them before any lease or kill."""

    def check(selection: Selection) -> None:
        if cfg.mode is LaunchMode.ROLES:
            from podguard.launch.roles import load_roles  # noqa: PLC0415  lazy: the TOML parser and the threaded controller, roles mode only

            assert cfg.options.job_file is not None
            load_roles(cfg.options.job_file, selection, master_port=cfg.options.master_port or 29500)

    return check


def _after(on_exit: OnExit, code: int, record: Path | None, guards: GuardWatch | None = None) -> int:
    if on_exit is OnExit.IDLE:
        if guards is not None and guards.settings.after_job:  # --idle-stop / --max-cost keep watching
            from podguard.guards.end import idle_guarded  # noqa: PLC0415  lazy: --on-exit idle with a guard only; guards.end loads pods.actions, pods.placement

            if not guards.gpus_chosen:  # no job ran in this container: every GPU of the node counts
                guards.watch_gpus(None)
            return idle_guarded(code, record, guards)
        return restart_guard.idle(code, record)
    if on_exit is OnExit.STOP_POD:
        from podguard.pods.selfheal import stop_own_pod  # noqa: PLC0415  lazy: --on-exit stop-pod only; pods.selfheal loads pods' spec model (~10 ms)

        return stop_own_pod(code)
    return code


def _self_heal(heal: SelfHealConfig | None, code: int, base: Path, report: Path | None) -> int:
    """Count the preflight's result for self-heal (pods/selfheal.py); the code to exit with."""
    if heal is None:
        return code
    from podguard.pods.selfheal import after_preflight  # noqa: PLC0415  lazy: self-heal only; pods.selfheal loads pods' spec model (~10 ms)

    return after_preflight(code, heal, state=base, report=report)

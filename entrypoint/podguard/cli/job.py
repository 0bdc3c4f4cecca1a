"""The flow behind `podguard train` and `podguard run`: the one place that composes preflight and launch.

    code = run_job_flow(configure(argv, launch_opts, grace_s=7.0), preflight_opts)

1. the restart guard (a restarted container does not re-run a finished job nor crash-loop);
2. the preflight: select, lease the GPUs, clean up leftover holders, gate; on a multi-node run, the cluster
   gate (every node's verdict, then all launch or none: cli/cluster.py);
3. a free MASTER_PORT and the prepare-once step;
4. launch in the chosen mode and supervise to the end, under the billing guards; record the outcome;
5. `--on-exit` (or, when a billing guard ended the job, stop this pod / exit 124: guards/).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.cli.cluster import cluster_gate_settings, pass_cluster_gate, worker_socket_env
from podguard.errors import ExitCode, PodguardError, UsageError, signal_exit_code
from podguard.gpu.selected import Selection
from podguard.launch.config import JobConfig, LaunchMode, LaunchOptions, OnExit, configure
from podguard.launch.spec import JobOutcome
from podguard.preflight.options import PreflightOptions
from podguard.preflight.pipeline import run_preflight
from podguard.redact import redact_command

if TYPE_CHECKING:
    from podguard.guards import GuardWatch
    from podguard.launch.supervisor import Watch
    from podguard.pods.selfheal import SelfHealConfig

__all__ = ["configure_counted", "run_job_flow"]


def configure_counted(
    argv: list[str], launch: LaunchOptions, opts: PreflightOptions, *, demo: bool = False
) -> JobConfig:
    """`configure`, with a refused configuration counted as a failed start by the restart guard.

    A container whose start command has a bad option restarts, fails at once, and restarts again: the
    entry process backs off like any other crash loop (a person at a shell still gets the error at once).
    """
    try:
        if demo:
            from podguard.demo import require_torch

            require_torch()  # one line naming torch and how to get it, before any GPU is touched
        cfg = configure(argv, launch, grace_s=opts.grace_s, demo=demo)
        if cfg.options.on_exit is OnExit.STOP_POD:
            from podguard.pods.selfheal import check_stop_pod

            check_stop_pod()  # inside a pod (RUNPOD_POD_ID) with an API key, or exit 64 before anything runs
        if _guarded(cfg):
            from podguard.guards import GuardSettings, check_guards

            check_guards(GuardSettings.from_options(cfg.options))  # --max-cost outside a pod: 64
        return cfg
    except UsageError as exc:
        _count_refused_start(argv or [str(launch.job_file)], launch.mode, opts, exc)
        raise


def _count_refused_start(argv: list[str], mode: str, opts: PreflightOptions, exc: UsageError) -> None:
    from podguard.launch import lifecycle
    from podguard.state import state_dir

    try:
        base = state_dir(opts.state_dir)
    except PodguardError:
        return  # no state dir: nothing to count in
    key = lifecycle.job_key(argv, mode, extra=[os.environ.get("GPU_LIST", "")])
    decision = lifecycle.plan_launch(key, state=base)
    if decision.delay_s > 0 and lifecycle.backoff_wait(decision, out=sys.stderr) is not None:
        return  # a signal ended the pause: exit with the usage error now
    lifecycle.record_run(
        key=key,
        argv=argv,
        mode=mode,
        exit_code=exc.code,
        started_at=time.time(),
        kind=lifecycle.RunKind.START,
        detail=exc.message,
        root_cause="configuration",
        state=base,
    )


def _guarded(cfg: JobConfig) -> bool:
    o = cfg.options
    return any(v is not None for v in (o.idle_stop, o.max_runtime, o.max_cost))


def run_job_flow(cfg: JobConfig, opts: PreflightOptions) -> int:
    """Run the whole flow and return the process exit code (see the module docstring)."""
    from podguard.state import state_dir

    base = state_dir(opts.state_dir)
    heal = _self_heal_config()  # PODGUARD_SELF_HEAL/_AFTER/PARK: a bad value is exit 64 before anything runs
    guards = _open_guards(cfg)  # --max-cost reads this pod's cost/hr and start from the API, once
    try:
        return _flow(cfg, opts, base, heal, guards)
    finally:
        if guards is not None:
            guards.close()


def _open_guards(cfg: JobConfig) -> GuardWatch | None:
    if not _guarded(cfg):
        return None
    from podguard.guards import GuardSettings, open_guards

    return open_guards(GuardSettings.from_options(cfg.options), lambda text: _say(f"podguard: {text}"))


def _flow(
    cfg: JobConfig, opts: PreflightOptions, base: Path, heal: SelfHealConfig | None, guards: GuardWatch | None
) -> int:
    from podguard.launch import lifecycle

    key = lifecycle.job_key(cfg.job_argv, cfg.mode, extra=[os.environ.get("GPU_LIST", "")])
    decision = lifecycle.plan_launch(key, rerun=cfg.options.rerun, state=base)
    if decision.delay_s > 0:
        got = lifecycle.backoff_wait(decision, out=sys.stderr)
        if got is not None:
            return signal_exit_code(got)
    if guards is not None and (trip := guards.check(time.monotonic())) is not None:  # the budget is spent already
        from podguard.guards.end import end_after_trip

        return end_after_trip(trip)
    # every exit from here on is recorded (best-effort), so that a restart loop backs off whatever failed;
    # the clock starts after the pause, or long pauses would make quick crashes look slow
    record = partial(
        lifecycle.record_run, key=key, argv=cfg.job_argv, mode=cfg.mode, started_at=time.time(), state=base
    )
    if decision.action is lifecycle.LaunchAction.SKIP:
        if not decision.delay_s:
            _say(f"podguard: {decision.reason}")
        skipped = record(exit_code=ExitCode.OK, kind=lifecycle.RunKind.SKIP)
        return _after(cfg, ExitCode.OK, skipped or decision.record, guards)

    opts = replace(
        opts,
        lease=True,
        extra={**opts.extra, "command_line": f"podguard {opts.command} -- {redact_command(cfg.argv)}"},
    )
    socket_env, notes = worker_socket_env()  # NCCL/GLOO_SOCKET_IFNAME from NODE_ADDR
    try:
        gate = cluster_gate_settings(cfg)  # multi-node: bad values are 64 before anything is leased or stopped
        pre = run_preflight(opts, validate_selection=_selection_check(cfg))
        try:
            passed = pass_cluster_gate(gate, pre, notes, base) if gate is not None else None  # every node's verdict
        except BaseException:
            if pre.lease is not None:
                pre.lease.release()
            raise
        if pre.exit_code != ExitCode.OK:
            failed = record(
                exit_code=pre.exit_code, kind=lifecycle.RunKind.START, detail=pre.message, root_cause="preflight"
            )
            healed = _self_heal(heal, pre.exit_code, base, pre.report_path)  # may restart/replace/park this pod
            return healed if healed != pre.exit_code else _after(cfg, pre.exit_code, failed, guards)
        _self_heal(heal, ExitCode.OK, base, pre.report_path)  # a pass resets the failure count
        assert pre.selection is not None
        if passed is None:
            _say_all(notes)
        try:
            if passed is not None and not passed.launch:  # another node failed or did not come: nobody launches
                stopped = record(
                    exit_code=passed.code, kind=lifecycle.RunKind.START, detail=passed.detail or "cluster gate",
                    root_cause="cluster gate",
                )  # fmt: skip
                return _after(cfg, passed.code, stopped, guards)
            code, outcome_record = _launch(cfg, opts, pre.selection, base, key, socket_env, guards)
        finally:
            if pre.lease is not None:
                pre.lease.release()
    except PodguardError as exc:  # a bad command, a failed prepare step, a port conflict: it counts too
        record(exit_code=exc.code, kind=lifecycle.RunKind.START, detail=exc.message, root_cause=type(exc).__name__)
        raise
    if guards is not None and guards.tripped is not None:  # the job is ended: stop this pod, or 124
        from podguard.guards.end import end_after_trip

        return end_after_trip(guards.tripped)
    return _after(cfg, code, outcome_record, guards)


def _launch(
    cfg: JobConfig,
    opts: PreflightOptions,
    selection: Selection,
    base: Path,
    key: str,
    extra_env: dict[str, str],
    guards: GuardWatch | None,
) -> tuple[int, Path | None]:
    """Steps 3 and 4: port, prepare, the mode's workers under supervision, the outcome record."""
    from podguard.launch import lifecycle

    started = time.time()
    run_dir = _run_dir(base)
    env: dict[str, str] = {**extra_env, "PODGUARD_RUN_DIR": str(run_dir), "PODGUARD_STATE_DIR": str(base)}
    mode = _pick_mode(cfg, selection)
    port_lease = None
    try:
        port = cfg.options.master_port
        # single mode: a script that spawns its own ranks (mp.spawn, a shell loop) needs a port of its own
        # too, unless the user's environment gives one
        single_port = mode is LaunchMode.SINGLE and not os.environ.get("MASTER_PORT")
        if (
            single_port
            or mode in (LaunchMode.PER_GPU, LaunchMode.ROLES)
            or (mode is LaunchMode.TORCHRUN and port is not None and not cfg.multi_node)
        ):
            from podguard.launch.ports import allocate_master_port

            port_lease = allocate_master_port(port, command=opts.extra.get("command_line"))
            port = port_lease.port
        if single_port and port is not None:
            env["MASTER_PORT"] = str(port)
            if not os.environ.get("MASTER_ADDR"):
                env["MASTER_ADDR"] = cfg.options.master_addr or "127.0.0.1"
        if cfg.prepare_argv is not None:
            env.update(_prepare(cfg, base, env))
        watch = None
        if guards is not None:
            guards.watch_gpus(selection.indices)  # a CPU-only run: --idle-stop is ignored with one warning
            _say(f"podguard: {guards.describe()}")
            watch = guards.supervised()
        outcome = _run_mode(mode, cfg, selection, env, port, run_dir, watch)
        record = lifecycle.record_outcome(
            outcome, key=key, argv=cfg.job_argv, mode=mode, started_at=started, state=base
        )
        _say(f"podguard: logs: {run_dir}")
        return outcome.exit_code, record
    finally:
        if port_lease is not None:
            port_lease.release()


def _run_dir(base: Path) -> Path:
    """`<state>/runs/<time>-<pid>`; a temp folder (with a warning) when the volume cannot take it (full)."""
    from podguard.state import subdir

    name = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"
    try:
        return subdir(subdir(base, "runs"), name)
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix=f"podguard-run-{name}-"))
        _say(f"podguard: warning: cannot create a run folder in {base / 'runs'} ({exc.strerror}); logs: {fallback}")
        return fallback


def _pick_mode(cfg: JobConfig, selection: Selection) -> LaunchMode:
    if cfg.mode is not LaunchMode.AUTO:
        return cfg.mode
    if cfg.multi_node:
        _say(f"podguard: mode auto -> torchrun: {cfg.options.nnodes} nodes (one rank per GPU on each)")
        return LaunchMode.TORCHRUN
    from podguard.launch.modes import pick_mode

    choice = pick_mode(cfg.argv, selection)
    _say(f"podguard: {choice.reason}")
    return LaunchMode(choice.mode)


def _selection_check(cfg: JobConfig) -> Callable[[Selection], None]:
    """Checks that need the selection (the roles GPU split); the preflight runs them before any lease or kill."""

    def check(selection: Selection) -> None:
        if cfg.mode is LaunchMode.ROLES:
            from podguard.launch.roles import load_roles

            assert cfg.options.job_file is not None
            load_roles(cfg.options.job_file, selection, master_port=cfg.options.master_port or 29500)

    return check


def _run_mode(
    mode: LaunchMode,
    cfg: JobConfig,
    selection: Selection,
    env: dict[str, str],
    port: int | None,
    run_dir: Path,
    watch: Watch | None = None,
) -> JobOutcome:
    from podguard.launch import modes
    from podguard.launch.run import run_job

    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    only_gpu = cfg.options.only_gpu
    only: set[str] | None = None
    if mode is LaunchMode.ROLES:
        from podguard.launch import roles  # the TOML parser and the threaded controller: roles mode only

        assert cfg.options.job_file is not None and port is not None
        plan = roles.load_roles(cfg.options.job_file, selection, master_port=port, log_dir=logs)
        if only_gpu is not None:
            only = modes.only_for_gpu(plan.specs(), only_gpu)
        return roles.run_roles(
            plan, selection, master_port=port, log_dir=logs, grace_s=cfg.grace_s, only=only, watch=watch
        )
    if mode is LaunchMode.TORCHRUN:
        return _run_torchrun(cfg, selection, env, port, run_dir, watch)
    if mode is LaunchMode.SINGLE:
        specs = [modes.single_spec(cfg.argv, selection, log_dir=logs, env=env)]
    else:
        assert port is not None
        specs = modes.per_gpu_specs(
            cfg.argv,
            selection,
            master_port=port,
            master_addr=cfg.options.master_addr or "127.0.0.1",
            prefix_format=cfg.options.prefix,
            log_dir=logs,
            nproc=cfg.options.cpu_workers,
            env=env,
        )
        if only_gpu is not None:
            only = modes.only_for_gpu(specs, only_gpu)
    return run_job(specs, grace_s=cfg.grace_s, only=only, watch=watch)


def _run_torchrun(
    cfg: JobConfig, selection: Selection, env: dict[str, str], port: int | None, run_dir: Path, watch: Watch | None
) -> JobOutcome:
    from podguard.launch.run import run_job
    from podguard.launch.summary import format_summary
    from podguard.launch.torchrun.command import build_torchrun_spec
    from podguard.launch.torchrun.failure import explain_torchrun_failure

    opts = cfg.options
    errors = run_dir / "torchrun"
    spec = build_torchrun_spec(
        list(cfg.argv),
        selection,
        nnodes=opts.nnodes,
        node_rank=opts.node_rank,
        master_addr=opts.master_addr,
        master_port=port,
        max_restarts=opts.max_restarts,
        error_dir=errors,
        log_dir=run_dir / "logs",
        extra_env=env,
        nproc=opts.cpu_workers,
        only_local_ranks=None if opts.only_gpu is None else _local_ranks_of(selection, opts.only_gpu),
        shutdown_timeout_s=max(cfg.grace_s - 1.0, 1.0),
        rdzv_backend=opts.rdzv_backend,
    )
    outcome = explain_torchrun_failure(run_job([spec], grace_s=cfg.grace_s, summary=False, watch=watch), errors)
    _say_all(format_summary(outcome).splitlines())  # `podguard: `-prefixed, as the other modes' summaries
    return outcome


def _local_ranks_of(selection: Selection, gpu: int) -> list[int]:
    ranks = [pos for pos, g in enumerate(selection.gpus) if g.index == gpu]
    if selection.gpus and not ranks:
        raise UsageError(f"--only-gpu={gpu}: GPU {gpu} is not selected; selected: {list(selection.indices)}")
    return ranks or [gpu]


def _prepare(cfg: JobConfig, base: Path, env: dict[str, str]) -> dict[str, str]:
    from podguard.launch.prepare import prepare_once

    assert cfg.prepare_argv is not None
    result = prepare_once(
        list(cfg.prepare_argv),
        cache_root=base / "prepare",
        key_parts=cfg.cache_key,
        env={**os.environ, **env},
        shared_storage=cfg.options.prepare_shared,
        node_rank=cfg.options.node_rank,
    )
    return {"PODGUARD_PREPARE_DIR": str(result.path)}


def _after(cfg: JobConfig, code: int, record: Path | None, guards: GuardWatch | None = None) -> int:
    if cfg.options.on_exit is OnExit.IDLE:
        if guards is not None and guards.settings.after_job:  # --idle-stop / --max-cost keep watching
            from podguard.guards.end import idle_guarded

            if not guards.gpus_chosen:  # no job ran in this container: every GPU of the node counts
                guards.watch_gpus(None)
            return idle_guarded(code, record, guards, out=sys.stderr)
        from podguard.launch.lifecycle import idle

        return idle(code, record, out=sys.stderr)
    if cfg.options.on_exit is OnExit.STOP_POD:
        from podguard.pods.selfheal import stop_own_pod

        return stop_own_pod(code)
    return code


def _self_heal_config() -> SelfHealConfig | None:
    """The in-pod self-heal settings, or None when none of its variables is set (nothing imported)."""
    if not any(os.environ.get(v) for v in ("PODGUARD_SELF_HEAL", "PODGUARD_SELF_HEAL_AFTER", "PODGUARD_PARK")):
        return None
    from podguard.pods.selfheal import SelfHealConfig

    return SelfHealConfig.from_env()


def _self_heal(heal: SelfHealConfig | None, code: int, base: Path, report: Path | None) -> int:
    """Count the preflight's result for self-heal (pods/selfheal.py); the code to exit with."""
    if heal is None:
        return code
    from podguard.pods.selfheal import after_preflight

    return after_preflight(code, heal, state=base, report=report)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _say_all(lines: list[str]) -> None:
    for line in lines:
        _say(f"podguard: {line}")

"""The flow behind `podguard train` and `podguard run`: the one place that composes preflight and launch.

    code = run_job_flow(configure(argv, launch_opts, grace_s=7.0), preflight_opts)

1. the restart guard (a restarted container does not re-run a finished job nor crash-loop);
2. the preflight: select, lease the GPUs, clean up leftover holders, gate;
3. a free MASTER_PORT and the prepare-once step;
4. launch in the chosen mode and supervise to the end; record the outcome;
5. `--on-exit`.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from podguard.errors import ExitCode, UsageError, signal_exit_code
from podguard.launch.config import JobConfig, LaunchMode, OnExit
from podguard.launch.spec import JobOutcome
from podguard.preflight.options import PreflightOptions
from podguard.preflight.pipeline import run_preflight
from podguard.preflight.selection import Selection

__all__ = ["run_job_flow"]


def run_job_flow(cfg: JobConfig, opts: PreflightOptions) -> int:
    """Run the whole flow and return the process exit code (see the module docstring)."""
    from podguard.launch import lifecycle
    from podguard.state import state_dir

    base = state_dir(opts.state_dir)
    key = lifecycle.job_key(cfg.job_argv, cfg.mode, extra=[os.environ.get("GPU_LIST", "")])
    decision = lifecycle.plan_launch(key, rerun=cfg.options.rerun, state=base)
    if decision.action == "skip":
        _say(f"podguard: {decision.reason}")
        return _after(cfg, ExitCode.OK, decision.record)
    if decision.action == "backoff":
        got = lifecycle.backoff_wait(decision, out=sys.stderr)
        if got is not None:
            return signal_exit_code(got)

    opts = replace(
        opts,
        lease=True,
        extra={**opts.extra, "command_line": f"podguard {opts.command} -- {shlex.join(cfg.argv)}"},
    )
    pre = run_preflight(opts, validate_selection=_selection_check(cfg))
    if pre.exit_code != ExitCode.OK:
        return _after(cfg, pre.exit_code, None)
    assert pre.selection is not None
    try:
        code, record = _launch(cfg, opts, pre.selection, base, key)
    finally:
        if pre.lease is not None:
            pre.lease.release()
    return _after(cfg, code, record)


def _launch(
    cfg: JobConfig, opts: PreflightOptions, selection: Selection, base: Path, key: str
) -> tuple[int, Path | None]:
    """Steps 3 and 4: port, prepare, the mode's workers under supervision, the outcome record."""
    from podguard.launch import lifecycle
    from podguard.state import subdir

    started = time.time()
    run_dir = subdir(subdir(base, "runs"), time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}")
    env: dict[str, str] = {"PODGUARD_RUN_DIR": str(run_dir), "PODGUARD_STATE_DIR": str(base)}
    mode = _pick_mode(cfg, selection)
    port_lease = None
    try:
        port = cfg.options.master_port
        if mode in (LaunchMode.PER_GPU, LaunchMode.ROLES) or (
            mode is LaunchMode.TORCHRUN and port is not None and not cfg.multi_node
        ):
            from podguard.preflight.leases import allocate_master_port

            port_lease = allocate_master_port(port, command=opts.extra.get("command_line"))
            port = port_lease.port
        if cfg.prepare_argv is not None:
            env.update(_prepare(cfg, base, env))
        outcome = _run_mode(mode, cfg, selection, env, port, run_dir)
        record = lifecycle.record_outcome(
            outcome, key=key, argv=cfg.job_argv, mode=mode, started_at=started, state=base
        )
        _say(f"podguard: logs: {run_dir}")
        return outcome.exit_code, record
    finally:
        if port_lease is not None:
            port_lease.release()


def _pick_mode(cfg: JobConfig, selection: Selection) -> LaunchMode:
    if cfg.mode is not LaunchMode.AUTO:
        return cfg.mode
    from podguard.launch.modes import pick_mode

    choice = pick_mode(cfg.argv, selection)
    _say(f"podguard: {choice.reason}")
    return LaunchMode(choice.mode)


def _selection_check(cfg: JobConfig) -> Callable[[Selection], None]:
    """Checks that need the selection (the roles GPU split); the preflight runs them before any lease or kill."""

    def check(selection: Selection) -> None:
        if cfg.mode is LaunchMode.ROLES:
            from podguard.launch.modes import load_roles

            assert cfg.options.job_file is not None
            load_roles(cfg.options.job_file, selection, master_port=cfg.options.master_port or 29500)

    return check


def _run_mode(
    mode: LaunchMode, cfg: JobConfig, selection: Selection, env: dict[str, str], port: int | None, run_dir: Path
) -> JobOutcome:
    from podguard.launch import modes
    from podguard.launch.supervisor import run_job

    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    only_gpu = cfg.options.only_gpu
    only: set[str] | None = None
    if mode is LaunchMode.ROLES:
        assert cfg.options.job_file is not None and port is not None
        plan = modes.load_roles(cfg.options.job_file, selection, master_port=port, log_dir=logs)
        if only_gpu is not None:
            only = modes.only_for_gpu(plan.specs(), only_gpu)
        return modes.run_roles(plan, selection, master_port=port, log_dir=logs, grace_s=cfg.grace_s, only=only)
    if mode is LaunchMode.TORCHRUN:
        return _run_torchrun(cfg, selection, env, port, run_dir)
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
    return run_job(specs, grace_s=cfg.grace_s, only=only)


def _run_torchrun(
    cfg: JobConfig, selection: Selection, env: dict[str, str], port: int | None, run_dir: Path
) -> JobOutcome:
    from podguard.launch.supervisor import format_summary, run_job
    from podguard.launch.torchrun.command import build_torchrun_spec, explain_torchrun_failure

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
    )
    outcome = explain_torchrun_failure(run_job([spec], grace_s=cfg.grace_s, summary=False), errors)
    _say(format_summary(outcome))
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


def _after(cfg: JobConfig, code: int, record: Path | None) -> int:
    if cfg.options.on_exit is OnExit.IDLE:
        from podguard.launch.lifecycle import idle

        return idle(code, record, out=sys.stderr)
    return code


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

"""`podguard train` and `podguard run` after their options are parsed: check the launch, then hand it to the
conductor (job/conductor.py: preflight, launch, watch, restarts, the END line, `--on-exit`).

    code = run_job_flow(configure_counted(argv, launch_opts, preflight_opts), preflight_opts)
"""

from __future__ import annotations

import os
import sys
import time

from podguard.errors import PodguardError, UsageError
from podguard.launch.config import JobConfig, LaunchOptions, OnExit, configure
from podguard.preflight.options import PreflightOptions

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
        from podguard.job.conductor import check_restarts, guarded

        check_restarts(cfg)
        if guarded(cfg):
            from podguard.guards import GuardSettings, check_guards

            check_guards(GuardSettings.from_options(cfg.options))  # --max-cost outside a pod: 64
        return cfg
    except UsageError as exc:
        _count_refused_start(argv or [str(launch.job_file)], launch.mode, opts, exc)
        raise


def _count_refused_start(argv: list[str], mode: str, opts: PreflightOptions, exc: UsageError) -> None:
    from podguard.job import restart_guard
    from podguard.state import state_dir

    try:
        base = state_dir(opts.state_dir)
    except PodguardError:
        return  # no state dir: nothing to count in
    key = restart_guard.job_key(argv, mode, extra=[os.environ.get("GPU_LIST", "")])
    decision = restart_guard.plan_launch(key, state=base)
    if decision.delay_s > 0 and restart_guard.backoff_wait(decision, out=sys.stderr) is not None:
        return  # a signal ended the pause: exit with the usage error now
    restart_guard.record_run(
        key=key,
        argv=argv,
        mode=mode,
        exit_code=exc.code,
        started_at=time.time(),
        kind=restart_guard.RunKind.START,
        detail=exc.message,
        root_cause="configuration",
        state=base,
    )


def run_job_flow(cfg: JobConfig, opts: PreflightOptions) -> int:
    """The job's whole lifecycle (job/conductor.py); the process exit code."""
    from podguard.job.conductor import run_job_flow as conduct

    return conduct(cfg, opts)

"""Every exit-64 check of `podguard train|run`, in one place and one order, before anything runs.

    settings = configure(["python", "train.py"], JobOptions(restarts=2), preflight_opts)   # UsageError (64)
    settings.launch.mode, settings.guards, settings.checkpoints, settings.metrics, settings.gate

`configure()` returns one composed `JobSettings` (job/options.py): the launch (launch/config.py), the lifecycle
(--on-exit, --rerun, --restarts), the run-time watch, the billing guards (guards/), the metrics (metrics/), the
checkpoints and their store, self-heal (pods/selfheal.py) and, on a multi-node run, the cluster gate
(job/multinode.py). Nothing is leased, killed, bound or launched while it runs, so a bad value anywhere
costs nothing. The checks, in this order (the first bad value is the one named):

1. the built-in demo needs torch (demo only);
2. the launch: --mode and --job-file, --prefix, --prepare/--cache-key, the nodes (launch/config.py);
   then --checkpoints/--save-signal/--checkpoint-store, --metrics-port against the rendezvous port;
3. --on-exit stop-pod: inside a pod, with an API key;
4. --restarts on a multi-node run (refused: torchrun's --max-restarts restarts every node together);
5. the billing guards: PODGUARD_GUARD_INTERVAL, --max-cost inside a pod with an API key;
6. self-heal: PODGUARD_SELF_HEAL, PODGUARD_SELF_HEAL_AFTER, PODGUARD_PARK (when any is set);
7. the metrics file's interval, PODGUARD_METRICS_INTERVAL (with --metrics-port or --metrics-file);
8. the cluster gate on a multi-node run: its ports and timeout, and torch in this Python.

What is opened rather than checked (the metrics port's bind, the checkpoint store's bucket) is opened by the
conductor next, still before the restart guard and the preflight (job/conductor.py).

`configure_counted()` is `configure()` with a refusal counted by the restart guard: a container whose start command
has a bad option restarts, fails at once, and restarts again; the entry process backs off like any other crash loop.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from podguard.demo import require_torch
from podguard.errors import PodguardError, UsageError
from podguard.guards.settings import GuardSettings, check_guards
from podguard.job import restart_guard
from podguard.job.multinode import cluster_gate_settings
from podguard.job.options import CheckpointSettings, JobOptions, JobSettings, MetricsSettings
from podguard.launch.config import JobConfig, OnExit
from podguard.launch.config import configure as configure_launch
from podguard.metrics.run import file_interval
from podguard.preflight.options import PreflightOptions
from podguard.state import state_dir

if TYPE_CHECKING:
    from podguard.pods.selfheal import SelfHealConfig

__all__ = ["SELF_HEAL_VARIABLES", "JobSettings", "check_restarts", "configure", "configure_counted"]

SELF_HEAL_VARIABLES = ("PODGUARD_SELF_HEAL", "PODGUARD_SELF_HEAL_AFTER", "PODGUARD_PARK")


def configure(argv: list[str], options: JobOptions, opts: PreflightOptions, *, demo: bool = False) -> JobSettings:
    """The checks of the module docstring, in its order; UsageError (exit 64) on the first bad value."""
    if demo:
        require_torch()  # one line naming torch and how to get it, before any GPU is touched
    launch = configure_launch(argv, options.launch(), grace_s=opts.grace_s, demo=demo)
    checkpoints = _check_checkpoints(options)
    _check_metrics(options)
    if options.on_exit is OnExit.STOP_POD:
        from podguard.pods.selfheal import check_stop_pod  # noqa: PLC0415  lazy: --on-exit stop-pod only; pods.selfheal loads pods' spec model (~10 ms)

        check_stop_pod()  # inside a pod (RUNPOD_POD_ID) with an API key
    check_restarts(options.restarts, launch)
    guards = None
    if any(v is not None for v in (options.idle_stop, options.max_runtime, options.max_cost)):
        guards = GuardSettings.configured(
            idle_stop_s=options.idle_stop, max_runtime_s=options.max_runtime, max_cost_usd=options.max_cost
        )
        check_guards(guards)  # --max-cost outside a pod: 64
    heal = _self_heal() if any(os.environ.get(v) for v in SELF_HEAL_VARIABLES) else None
    metrics = None
    if options.metrics_port is not None or options.metrics_file is not None:
        metrics = MetricsSettings(options.metrics_port, options.metrics_file, file_interval())
    # multi-node only; says once when there is no NODE_RANK
    gate = cluster_gate_settings(launch, port=options.cluster_port, timeout_s=options.cluster_timeout_s)
    return JobSettings(
        launch,
        on_exit=options.on_exit,
        rerun=options.rerun,
        restarts=options.restarts,
        hang_timeout_s=options.hang_timeout,
        progress=options.progress,
        guards=guards,
        metrics=metrics,
        checkpoints=checkpoints,
        self_heal=heal,
        gate=gate,
    )


def _self_heal() -> SelfHealConfig:
    from podguard.pods.selfheal import SelfHealConfig  # noqa: PLC0415  lazy: self-heal only; pods.selfheal loads pods' spec model (~10 ms)

    return SelfHealConfig.from_env()


def check_restarts(restarts: int, cfg: JobConfig) -> None:
    """`--restarts` relaunches this node's job: a multi-node run restarts through torchrun instead (64)."""
    if restarts and cfg.multi_node:
        raise UsageError(
            f"--restarts={restarts} relaunches one node's job; on a multi-node run use --max-restarts "
            "(torchrun restarts the worker group on every node together)"
        )


def _check_checkpoints(opts: JobOptions) -> CheckpointSettings | None:
    """--checkpoints, --save-signal, --checkpoint-store; their settings (None without --checkpoints)."""
    if opts.checkpoints is not None and os.path.exists(opts.checkpoints) and not os.path.isdir(opts.checkpoints):
        raise UsageError(f"--checkpoints={str(opts.checkpoints)!r} is not a folder; give the folder the job saves to")
    if opts.save_signal is not None and opts.checkpoints is None:
        raise UsageError(
            "--save-signal needs --checkpoints DIR: podguard waits for the new checkpoint there before it ends the job"
        )
    if opts.checkpoint_store is not None and opts.checkpoints is None:
        raise UsageError(
            f"--checkpoint-store={opts.checkpoint_store} needs --checkpoints DIR: podguard mirrors the checkpoints "
            "the job writes there"
        )
    if opts.checkpoints is None:
        return None
    return CheckpointSettings(
        opts.checkpoints, opts.save_signal, opts.save_grace, opts.checkpoint_store, opts.store_keep
    )


def _check_metrics(opts: JobOptions) -> None:
    """The metrics are bound before the launch: on the rendezvous port (`run` hands the job MASTER_PORT) the job's
    rendezvous would find it taken."""
    rendezvous = {str(opts.master_port), os.environ.get("MASTER_PORT", "").strip()}
    if opts.metrics_port is not None and str(opts.metrics_port) in rendezvous:
        raise UsageError(
            f"--metrics-port={opts.metrics_port} is also the rendezvous port (--master-port or MASTER_PORT); give "
            "the metrics a port of their own, e.g. 9464"
        )


def configure_counted(
    argv: list[str], options: JobOptions, opts: PreflightOptions, *, demo: bool = False
) -> JobSettings:
    """`configure`, with a refused configuration counted as a failed start by the restart guard (a person at a
    shell still gets the error at once)."""
    try:
        return configure(argv, options, opts, demo=demo)
    except UsageError as exc:
        _count_refused_start(argv or [str(options.job_file)], options.mode, opts, exc)
        raise


def _count_refused_start(argv: list[str], mode: str, opts: PreflightOptions, exc: UsageError) -> None:
    try:
        base = state_dir(opts.state_dir)
    except PodguardError:
        return  # no state dir: nothing to count in
    key = restart_guard.job_key(argv, mode, extra=[os.environ.get("GPU_LIST", "")])
    decision = restart_guard.plan_launch(key, state=base)
    if decision.delay_s > 0 and restart_guard.backoff_wait(decision) is not None:
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

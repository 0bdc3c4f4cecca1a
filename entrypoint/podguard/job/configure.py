"""Every exit-64 check of `podguard train|run`, in one place and one order, before anything runs.

    settings = configure(["python", "train.py"], launch_options, preflight_opts)   # UsageError (64) on a bad value
    settings.launch.mode, settings.guards, settings.self_heal, settings.metrics_every_s, settings.gate

`configure()` returns one composed `JobSettings`: the launch (launch/config.py), the billing guards (guards/), the
metrics file's interval (metrics/), the restarts, self-heal (pods/selfheal.py) and, on a multi-node run, the
cluster gate (job/multinode.py). Nothing is leased, killed, bound or launched while it runs, so a bad value anywhere
costs nothing. The checks, in this order (the first bad value is the one named):

1. the built-in demo needs torch (demo only);
2. the launch: --mode and --job-file, --prefix, --prepare/--cache-key, --checkpoints/--save-signal/
   --checkpoint-store, --metrics-port against the rendezvous port, the nodes (launch/config.py);
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
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from podguard.demo import require_torch
from podguard.errors import PodguardError, UsageError
from podguard.guards.settings import GuardSettings, check_guards
from podguard.job import restart_guard
from podguard.job.multinode import cluster_gate_settings
from podguard.launch.config import JobConfig, LaunchOptions, OnExit
from podguard.launch.config import configure as configure_launch
from podguard.metrics.run import file_interval
from podguard.preflight.options import PreflightOptions
from podguard.state import state_dir

if TYPE_CHECKING:
    from podguard.launch.cluster.model import GateSettings
    from podguard.pods.selfheal import SelfHealConfig

__all__ = ["SELF_HEAL_VARIABLES", "JobSettings", "check_restarts", "configure", "configure_counted"]

SELF_HEAL_VARIABLES = ("PODGUARD_SELF_HEAL", "PODGUARD_SELF_HEAL_AFTER", "PODGUARD_PARK")


@dataclass(frozen=True)
class JobSettings:
    """A `train`/`run` as checked: everything the conductor needs, composed from the options and the environment."""

    launch: JobConfig  # what to run and how (the launch's options as given: launch.options)
    guards: GuardSettings | None = None  # --idle-stop, --max-runtime, --max-cost (None: no guard)
    self_heal: SelfHealConfig | None = None  # None: none of SELF_HEAL_VARIABLES is set
    metrics_every_s: float | None = None  # PODGUARD_METRICS_INTERVAL (None: the file's default)
    gate: GateSettings | None = None  # the cluster gate on a multi-node run (None: one node, or no NODE_RANK)

    @property
    def restarts(self) -> int:
        return self.launch.options.restarts

    @property
    def on_exit(self) -> OnExit:
        return self.launch.options.on_exit


def configure(argv: list[str], options: LaunchOptions, opts: PreflightOptions, *, demo: bool = False) -> JobSettings:
    """The checks of the module docstring, in its order; UsageError (exit 64) on the first bad value."""
    if demo:
        require_torch()  # one line naming torch and how to get it, before any GPU is touched
    launch = configure_launch(argv, options, grace_s=opts.grace_s, demo=demo)
    if options.on_exit is OnExit.STOP_POD:
        from podguard.pods.selfheal import check_stop_pod  # lazy: pods/ loads its spec model (~10 ms), rarely used

        check_stop_pod()  # inside a pod (RUNPOD_POD_ID) with an API key
    check_restarts(launch)
    guards = None
    if any(v is not None for v in (options.idle_stop, options.max_runtime, options.max_cost)):
        guards = GuardSettings.configured(
            idle_stop_s=options.idle_stop, max_runtime_s=options.max_runtime, max_cost_usd=options.max_cost
        )
        check_guards(guards)  # --max-cost outside a pod: 64
    heal = _self_heal() if any(os.environ.get(v) for v in SELF_HEAL_VARIABLES) else None
    every_s = None
    if options.metrics_port is not None or options.metrics_file is not None:
        every_s = file_interval()
    gate = cluster_gate_settings(launch)  # multi-node only; says once when there is no NODE_RANK
    return JobSettings(launch, guards, heal, every_s, gate)


def _self_heal() -> SelfHealConfig:
    from podguard.pods.selfheal import SelfHealConfig  # lazy: pods/ loads its spec model (~10 ms), rarely used

    return SelfHealConfig.from_env()


def check_restarts(cfg: JobConfig) -> None:
    """`--restarts` relaunches this node's job: a multi-node run restarts through torchrun instead (64)."""
    if cfg.options.restarts and cfg.multi_node:
        raise UsageError(
            f"--restarts={cfg.options.restarts} relaunches one node's job; on a multi-node run use --max-restarts "
            "(torchrun restarts the worker group on every node together)"
        )


def configure_counted(
    argv: list[str], options: LaunchOptions, opts: PreflightOptions, *, demo: bool = False
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

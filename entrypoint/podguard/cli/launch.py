"""`podguard train` and `podguard run`: thin commands over the conductor (job/conductor.py: one call, from the checks
of the configuration to the END line). `podguard sweep` is cli/sweep.py."""

from __future__ import annotations

from dataclasses import replace

import typer

from podguard.cli.options import LAUNCH, PREFLIGHT
from podguard.cli.params import Command, options
from podguard.job.conductor import conduct
from podguard.job.options import JobOptions
from podguard.launch.config import DEMO_CPU_WORKERS, LaunchMode, demo_argv
from podguard.preflight.options import PreflightOptions

PREFLIGHT_ALL = tuple(name for name in PREFLIGHT.params if name != "dry_run")
LAUNCH_ALL = tuple(LAUNCH.params)
RUN_LAUNCH = (
    *("only_gpu", "on_exit", "idle_stop", "max_runtime", "max_cost", "hang_timeout", "progress", "restarts"),
    *("checkpoints", "save_signal", "save_grace", "checkpoint_store", "store_keep"),
    *("metrics_port", "metrics_file"),
)


def register(app: typer.Typer, only: str | None = None) -> None:
    for name, func in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(func)


@options(LAUNCH, LAUNCH_ALL, into="launch")
@options(PREFLIGHT, PREFLIGHT_ALL, into="opts", command="train")
def train(opts: PreflightOptions, launch: JobOptions, command: Command = None) -> None:
    """Preflight, then launch CMD and supervise it to the end. Without CMD: the built-in demo training job."""
    argv = list(command or [])
    demo = not argv and launch.job_file is None
    if demo:
        argv = demo_argv()
        auto = LaunchMode.TORCHRUN if (launch.nnodes or 1) > 1 else LaunchMode.PER_GPU  # a cluster node: torchrun
        launch = replace(
            launch,
            mode=auto if launch.mode is LaunchMode.AUTO else launch.mode,
            cpu_workers=DEMO_CPU_WORKERS if launch.cpu_workers is None else launch.cpu_workers,
        )
    raise typer.Exit(conduct(argv, launch, opts, demo=demo))


@options(LAUNCH, RUN_LAUNCH, into="launch", mode=LaunchMode.SINGLE, rerun=True)
@options(PREFLIGHT, PREFLIGHT_ALL, into="opts", command="run")
def run(opts: PreflightOptions, launch: JobOptions, command: Command = None) -> None:
    """The same preflight for any command (an inference server, a notebook), then run and supervise it.

    A restarted container starts it again (services are not "finished" like a training job)."""
    raise typer.Exit(conduct(list(command or []), launch, opts))


COMMANDS = {"train": train, "run": run}

"""`podguard sweep`: N concurrent `podguard train` runs of K GPUs each on this node (job/sweep.py plans and runs them).

Its own module so that `podguard run` (a job's start-up path) does not load the sweep: the CLI loads a command's
module when the command runs (cli/app.py)."""

from __future__ import annotations

import os

import typer

from podguard.cli.options import PREFLIGHT
from podguard.cli.params import Command, options
from podguard.errors import ExitCode, PodguardError
from podguard.job.sweep import plan_sweep, run_sweep
from podguard.preflight.inventory import read_inventory
from podguard.preflight.options import PreflightOptions
from podguard.preflight.selection import select_gpus
from podguard.state import state_dir


def register(app: typer.Typer, only: str | None = None) -> None:
    if only in (None, "sweep"):
        app.command("sweep")(sweep)


@options(PREFLIGHT, ("gpu_list", "grace_s", "state_dir"), into="opts", command="sweep")
def sweep(
    opts: PreflightOptions,
    command: Command = None,
    gpus_per_run: str = typer.Option(..., "--gpus-per-run", envvar="PODGUARD_GPUS_PER_RUN", help="GPUs per run."),
    runs: str | None = typer.Option(
        None, "--runs", envvar="PODGUARD_RUNS", help="How many runs (default: as many as fit on the node)."
    ),
    name: str | None = typer.Option(None, "--name", envvar="PODGUARD_SWEEP_NAME", help="Sweep name (for logs)."),
) -> None:
    """Launch N concurrent `podguard train` runs of K GPUs each on this node (disjoint GPUs, distinct ports)."""
    base = state_dir(opts.state_dir)
    _, snaps = read_inventory()
    selection = select_gpus(snaps, gpu_list=opts.gpu_list, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if selection.cpu_only:
        raise PodguardError("a sweep splits GPUs between runs, but this node has no GPU", ExitCode.GPUS_MISSING)
    plan = plan_sweep(list(selection.indices), gpus_per_run, runs)
    result = run_sweep(plan, list(command or []), name=name, log_dir=base / "sweeps", grace_s=opts.grace_s)
    raise typer.Exit(result.exit_code)

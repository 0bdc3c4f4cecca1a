"""Node commands: `gpus`, `health`, `cleanup`, `doctor`. Each is a thin shell over a library function."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from podguard.cli import params as o
from podguard.errors import ExitCode, PodguardError
from podguard.preflight.pipeline import run_preflight, validate_options


def register(app: typer.Typer, only: str | None = None) -> None:
    for name, func in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(func)


def gpus(
    gpu_list: o.GpuList = None,
    nproc_per_node: o.NprocPerNode = None,
    expect_gpus: o.ExpectGpus = None,
    on_fewer: o.OnFewer = "fail",
    require_gpu: o.RequireGpu = False,
    as_json: o.Json = False,
) -> None:
    """The GPU inventory and the selection this node would use (GPU_LIST / CUDA_VISIBLE_DEVICES / NPROC_PER_NODE)."""
    from podguard.preflight.inventory import inventory_payload, render_inventory

    opts = o.options_from("gpus", locals())
    payload = inventory_payload(opts)
    if as_json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        print()
    else:
        print(render_inventory(payload))
    if payload.get("error"):
        print(f"podguard: error: {payload['error']['message']}", file=sys.stderr)
        raise typer.Exit(payload["error"]["exit_code"])


def health(
    gpu_list: o.GpuList = None,
    nproc_per_node: o.NprocPerNode = None,
    expect_gpus: o.ExpectGpus = None,
    on_fewer: o.OnFewer = "fail",
    require_gpu: o.RequireGpu = False,
    idle_memory_mib: o.IdleMemory = "512",
    probe: o.Probe = "auto",
    probe_cmd: o.ProbeCmd = None,
    probe_timeout: o.ProbeTimeout = "60",
    temperature_margin: o.TempMargin = "0",
    fail_on_warnings: o.FailOnWarnings = False,
    state_dir: o.StateDir = None,
    as_json: o.Json = False,
) -> None:
    """The health gate alone (no cleanup). Exit code: 0 healthy, 69 missing, 75 busy, 76 unhealthy."""
    opts = o.options_from("health", locals())
    _finish(run_preflight(opts), as_json)


def cleanup(
    dry_run: bool = typer.Option(False, "--dry-run", envvar="PODGUARD_DRY_RUN", help="Report, kill nothing."),
    gpu_list: o.GpuList = None,
    busy_timeout: o.BusyTimeout = "60",
    grace: o.Grace = "7",
    protect: o.Protect = None,
    kill_pattern: o.KillPattern = None,
    idle_memory_mib: o.IdleMemory = "512",
    state_dir: o.StateDir = None,
    dev_dir: o.DevDir = Path("/dev"),
    as_json: o.Json = False,
) -> None:
    """Find and stop what holds the GPUs (job trees, launcher first), then wait for their memory to come back."""
    opts = o.options_from("cleanup", locals(), probe="off", on_fewer="continue")
    _finish(run_preflight(opts), as_json)


def doctor(
    state_dir: o.StateDir = None,
    dev_dir: o.DevDir = Path("/dev"),
    as_json: o.Json = False,
) -> None:
    """Everything a person needs when something is wrong: driver, GPUs, holders, health, env, recommendations."""
    from podguard.preflight.doctor import collect, render

    opts = o.build_options("doctor", state_dir=state_dir, dev_dir=dev_dir, probe="off", on_fewer="continue")
    try:
        validate_options(opts)
    except PodguardError as exc:
        raise PodguardError(exc.message, exc.code) from None
    data = collect(opts)
    if as_json:
        json.dump(data, sys.stdout, indent=2, default=str)
        print()
    else:
        print(render(data))


def _finish(result, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    if as_json:
        payload = {
            "exit_code": result.exit_code,
            "message": result.message,
            "report_path": str(result.report_path) if result.report_path else None,
        }
        if result.report_path:
            payload["report"] = json.loads(Path(result.report_path).read_text())
        json.dump(payload, sys.stdout, indent=2, default=str)
        print()
    if result.exit_code != ExitCode.OK:
        raise typer.Exit(result.exit_code)


COMMANDS = {"gpus": gpus, "health": health, "cleanup": cleanup, "doctor": doctor}

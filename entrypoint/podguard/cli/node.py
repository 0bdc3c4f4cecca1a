"""Node commands: `gpus`, `health`, `cleanup`, `doctor`. Each is a thin shell over a library function."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from podguard import console
from podguard.cli.app import discard_stdout
from podguard.cli.options import PREFLIGHT
from podguard.cli.params import Json, options
from podguard.errors import ExitCode
from podguard.preflight.options import OnFewer, PreflightOptions, ProbeMode

SELECT = ("gpu_list", "nproc_per_node", "expect_gpus", "on_fewer", "require_gpu")
GATE = (
    "idle_memory_mib",
    "probe",
    "probe_cmd",
    "probe_timeout_s",
    "max_temperature_margin_c",
    "fail_on_warnings",
    "degraded",
    "slow_ratio",
)
CLEANUP = ("dry_run", "gpu_list", "busy_timeout_s", "grace_s", "protect", "kill_patterns", "idle_memory_mib")
WHERE = ("state_dir", "dev_dir")


def register(app: typer.Typer, only: str | None = None) -> None:
    for name, func in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(func)


@options(PREFLIGHT, SELECT, into="opts", command="gpus")
def gpus(opts: PreflightOptions, as_json: Json = False) -> None:
    """The GPU inventory and the selection this node would use (GPU_LIST / CUDA_VISIBLE_DEVICES / NPROC_PER_NODE)."""
    from podguard.preflight.inventory import inventory_payload, render_inventory  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    payload = inventory_payload(opts)
    if as_json:
        _dump(payload)
    else:
        _print(render_inventory(payload))
    if payload.get("error"):
        console.error(payload["error"]["message"])
        raise typer.Exit(payload["error"]["exit_code"])


@options(PREFLIGHT, (*SELECT, *GATE, "state_dir"), into="opts", command="health")
def health(opts: PreflightOptions, as_json: Json = False) -> None:
    """The health gate alone (no cleanup). Exit code: 0 healthy, 69 missing, 75 busy, 76 unhealthy."""
    from podguard.preflight.pipeline import run_preflight  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    _finish(run_preflight(opts), as_json)


@options(PREFLIGHT, (*CLEANUP, *WHERE), into="opts", command="cleanup", probe=ProbeMode.OFF, on_fewer=OnFewer.CONTINUE)
def cleanup(opts: PreflightOptions, as_json: Json = False) -> None:
    """Find and stop what holds the GPUs (job trees, launcher first), then wait for their memory to come back."""
    from podguard.preflight.pipeline import run_preflight  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    _finish(run_preflight(opts), as_json)


@options(PREFLIGHT, (*WHERE, "degraded"), into="opts", command="doctor", probe=ProbeMode.OFF, on_fewer=OnFewer.CONTINUE)
def doctor(opts: PreflightOptions, as_json: Json = False) -> None:
    """Everything a person needs when something is wrong: driver, GPUs, holders, health, env, recommendations."""
    from podguard.preflight.doctor import collect, render  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs
    from podguard.preflight.options import validate_options  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs

    validate_options(opts)
    data = collect(opts)
    if as_json:
        _dump(data)
    else:
        _print(render(data))


def _dump(data: object) -> None:
    _print(json.dumps(data, indent=2, default=str))


def _print(text: str) -> None:
    """Print the command's output; a reader that went away (`| head`) does not change the exit code."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        discard_stdout()


def _finish(result, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    if as_json:
        payload = {
            "exit_code": result.exit_code,
            "message": result.message,
            "report_path": str(result.report_path) if result.report_path else None,
        }
        if result.report_path:
            payload["report"] = json.loads(Path(result.report_path).read_text())
        _dump(payload)
    if result.exit_code != ExitCode.OK:
        raise typer.Exit(result.exit_code)


COMMANDS = {"gpus": gpus, "health": health, "cleanup": cleanup, "doctor": doctor}

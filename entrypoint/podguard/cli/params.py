"""Options shared by the commands that run the preflight (train, run, health, cleanup, gpus).

Each option reads `PODGUARD_<OPTION>` and, where users already have a name for it (GPU_LIST,
NPROC_PER_NODE, RUNPOD_GPU_COUNT, PODGUARD_PROBE, ...), that name too.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated

import typer

from podguard.errors import UsageError
from podguard.preflight.pipeline import PreflightOptions

PREFLIGHT = "Preflight"

GpuList = Annotated[
    str | None,
    typer.Option(
        "--gpu-list",
        envvar=["PODGUARD_GPU_LIST", "GPU_LIST"],
        help="GPUs to use: NVML indices or UUIDs, e.g. 0,1,2,3. Default: CUDA_VISIBLE_DEVICES, else all.",
        rich_help_panel=PREFLIGHT,
    ),
]
NprocPerNode = Annotated[
    str | None,
    typer.Option(
        "--nproc-per-node",
        envvar=["PODGUARD_NPROC_PER_NODE", "NPROC_PER_NODE"],
        help="Use this many GPUs (caps the selection; more than selected fails unless --on-fewer-gpus continue).",
        rich_help_panel=PREFLIGHT,
    ),
]
ExpectGpus = Annotated[
    str | None,
    typer.Option(
        "--expect-gpus",
        envvar=["PODGUARD_EXPECT_GPUS", "RUNPOD_GPU_COUNT"],
        help="GPUs this node should have (default: RUNPOD_GPU_COUNT).",
        rich_help_panel=PREFLIGHT,
    ),
]
OnFewer = Annotated[
    str,
    typer.Option(
        "--on-fewer-gpus",
        envvar="PODGUARD_ON_FEWER_GPUS",
        help="fail (exit 69) or continue (loudly) when fewer GPUs than expected.",
        rich_help_panel=PREFLIGHT,
    ),
]
RequireGpu = Annotated[
    bool,
    typer.Option(
        "--require-gpu/--allow-cpu",
        envvar="PODGUARD_REQUIRE_GPU",
        help="No GPU at all is an error (69) instead of a CPU fallback.",
        rich_help_panel=PREFLIGHT,
    ),
]
Cleanup = Annotated[
    bool,
    typer.Option(
        "--cleanup/--no-cleanup",
        envvar="PODGUARD_CLEANUP",
        help="Stop leftover processes that hold the selected GPUs before starting.",
        rich_help_panel=PREFLIGHT,
    ),
]
BusyTimeout = Annotated[
    str,
    typer.Option(
        "--busy-timeout",
        envvar="PODGUARD_BUSY_TIMEOUT",
        help="Seconds to wait for busy GPUs to become free before giving up (exit 75).",
        rich_help_panel=PREFLIGHT,
    ),
]
Grace = Annotated[
    str,
    typer.Option(
        "--grace",
        envvar="PODGUARD_GRACE",
        help="Seconds between SIGTERM and SIGKILL when stopping processes.",
        rich_help_panel=PREFLIGHT,
    ),
]
Protect = Annotated[
    list[str] | None,
    typer.Option(
        "--protect",
        envvar="PODGUARD_PROTECT",
        help="Process name never to stop (repeatable; added to sshd, jupyter, nginx, ...).",
        rich_help_panel=PREFLIGHT,
    ),
]
KillPattern = Annotated[
    list[str] | None,
    typer.Option(
        "--kill-pattern",
        envvar="PODGUARD_KILL_PATTERN",
        help="Launcher name (e.g. sglang, torchrun) whose job tree is stopped when one of its processes holds a GPU.",
        rich_help_panel=PREFLIGHT,
    ),
]
IdleMemory = Annotated[
    str,
    typer.Option(
        "--idle-memory-mib",
        envvar="PODGUARD_IDLE_MEMORY_MIB",
        help="GPU memory in use at or below this, with no process, counts as idle.",
        rich_help_panel=PREFLIGHT,
    ),
]
Probe = Annotated[
    str,
    typer.Option(
        "--probe",
        envvar="PODGUARD_PROBE",
        help="Health probe: cuda (a child allocates and runs a matmul on each GPU), off (NVML only), auto.",
        rich_help_panel=PREFLIGHT,
    ),
]
ProbeCmd = Annotated[
    str | None,
    typer.Option(
        "--probe-cmd",
        envvar="PODGUARD_PROBE_CMD",
        help="Your own probe program, run per GPU with only that GPU visible (exit 0 = healthy).",
        rich_help_panel=PREFLIGHT,
    ),
]
ProbeTimeout = Annotated[
    str,
    typer.Option(
        "--probe-timeout",
        envvar="PODGUARD_PROBE_TIMEOUT",
        help="Seconds before a hung probe is killed and its GPU marked unhealthy.",
        rich_help_panel=PREFLIGHT,
    ),
]
TempMargin = Annotated[
    str,
    typer.Option(
        "--temperature-margin",
        envvar="PODGUARD_TEMPERATURE_MARGIN",
        help="Warn when a GPU is within this many degrees C of its slowdown temperature.",
        rich_help_panel=PREFLIGHT,
    ),
]
FailOnWarnings = Annotated[
    bool,
    typer.Option(
        "--fail-on-warnings",
        envvar="PODGUARD_FAIL_ON_WARNINGS",
        help="Treat gate warnings (slowdown, temperature, PCIe width, ECC off) as failures (76).",
        rich_help_panel=PREFLIGHT,
    ),
]
StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="PODGUARD_STATE_DIR",
        help="Where reports, logs, locks and leases live (default /workspace/.podguard when /workspace exists).",
    ),
]
DevDir = Annotated[
    Path,
    typer.Option(
        "--dev-dir",
        envvar="PODGUARD_DEV_DIR",
        help="Where the NVIDIA device files are looked for when finding GPU holders.",
        rich_help_panel=PREFLIGHT,
    ),
]
Json = Annotated[bool, typer.Option("--json", envvar="PODGUARD_JSON", help="Print machine-readable JSON.")]


def build_options(
    command: str,
    *,
    gpu_list: str | None = None,
    nproc_per_node: str | None = None,
    expect_gpus: str | None = None,
    on_fewer: str = "fail",
    require_gpu: bool = False,
    cleanup: bool = True,
    dry_run: bool = False,
    busy_timeout: str | float = 60.0,
    grace: str | float = 7.0,
    protect: list[str] | None = None,
    kill_pattern: list[str] | None = None,
    idle_memory_mib: str | int = 512,
    probe: str = "auto",
    probe_cmd: str | None = None,
    probe_timeout: str | float = 60.0,
    temperature_margin: str | int = 0,
    fail_on_warnings: bool = False,
    state_dir: Path | None = None,
    dev_dir: Path = Path("/dev"),
) -> PreflightOptions:
    return PreflightOptions(
        gpu_list=gpu_list,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        nproc_per_node=nproc_per_node,
        expect_gpus=expect_gpus,
        on_fewer=on_fewer,
        require_gpu=require_gpu,
        cleanup=cleanup,
        dry_run=dry_run,
        busy_timeout_s=parse_seconds(busy_timeout, "--busy-timeout"),
        grace_s=parse_seconds(grace, "--grace"),
        protect=tuple(_split(protect)),
        kill_patterns=tuple(_split(kill_pattern)),
        idle_memory_mib=parse_int(idle_memory_mib, "--idle-memory-mib"),
        probe=probe.strip().lower(),
        probe_cmd=probe_cmd or None,
        probe_timeout_s=parse_seconds(probe_timeout, "--probe-timeout"),
        max_temperature_margin_c=parse_int(temperature_margin, "--temperature-margin"),
        fail_on_warnings=fail_on_warnings,
        state_dir=state_dir,
        dev_dir=dev_dir,
        command=command,
    )


def options_from(command: str, values: dict[str, object], **overrides: object) -> PreflightOptions:
    """`build_options` from a command function's `locals()`: the preflight options it declares, nothing else.

    Typer needs each command's parameters spelled out in its signature; this keeps the bodies from
    repeating the same twenty keyword arguments.
    """
    accepted = set(inspect.signature(build_options).parameters) - {"command"}
    kwargs = {k: v for k, v in values.items() if k in accepted}
    kwargs.update(overrides)
    return build_options(command, **kwargs)  # type: ignore[arg-type]


def parse_seconds(raw: str | float, name: str) -> float:
    """A duration in seconds; the error names the option and the bad value (exit 64)."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds; expected e.g. 30 or 0.5") from None
    if not (0 <= value < float("inf")):
        raise UsageError(f"{name}={raw} is not valid; expected a finite number of seconds >= 0")
    return value


def parse_int(raw: str | int, name: str, minimum: int = 0) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number; expected an integer >= {minimum}") from None
    if value < minimum:
        raise UsageError(f"{name}={value} is not valid; expected an integer >= {minimum}")
    return value


def _split(values: list[str] | None) -> list[str]:
    """Accept repeated options and comma/space separated env values alike."""
    out: list[str] = []
    for value in values or []:
        out.extend(v for v in value.replace(",", " ").split() if v)
    return out

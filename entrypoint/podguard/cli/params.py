"""Command-line parameters, each declared once: flag, environment variables, type and bounds, help.

A command names the groups it takes and receives them as records, never as loose locals:

    @options(PREFLIGHT, ("gpu_list", "probe"), into="opts", command="health")
    def health(opts: PreflightOptions, as_json: Json = False) -> None: ...

Defaults come from the record's dataclass (`PreflightOptions`, `LaunchOptions`), so they live in one place.
Values are parsed by podguard, so a bad one is one line naming it and what is valid (exit 64).
"""

from __future__ import annotations

import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from podguard.errors import UsageError
from podguard.launch.config import LaunchMode, LaunchOptions, OnExit
from podguard.preflight.options import OnFewer, PreflightOptions, ProbeMode
from podguard.preflight.selection import parse_count

__all__ = ["LAUNCH", "PREFLIGHT", "Command", "Group", "Json", "Param", "options", "parse_int", "parse_seconds"]

F = TypeVar("F", bound=Callable[..., Any])

PREFLIGHT_PANEL = "Preflight"
LAUNCH_PANEL = "Launch"

Command = Annotated[list[str] | None, typer.Argument(help="The command to run, after `--`.", show_default=False)]
Json = Annotated[bool, typer.Option("--json", envvar="PODGUARD_JSON", help="Print machine-readable JSON.")]


# --------------------------------------------------------------------------------------------------
# value parsers: each error names the option (or variable) and the bad value, and says what is valid
# --------------------------------------------------------------------------------------------------


def parse_seconds(raw: Any, name: str) -> float:
    """A finite duration in seconds >= 0."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds; expected e.g. 30 or 0.5") from None
    if not (0 <= value < float("inf")):
        raise UsageError(f"{name}={raw} is not valid; expected a finite number of seconds >= 0")
    return value


def parse_int(raw: Any, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number within [minimum, maximum]."""
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number; expected an integer >= {minimum}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"{minimum}-{maximum}"
        raise UsageError(f"{name}={value} is not valid; expected an integer {bound}")
    return value


def _seconds(name: str) -> Callable[[Any], float]:
    return lambda raw: parse_seconds(raw, name)


def _whole(name: str, minimum: int = 0, maximum: int | None = None) -> Callable[[Any], int]:
    return lambda raw: parse_int(raw, name, minimum, maximum)


def _count(name: str, minimum: int) -> Callable[[Any], int | None]:
    return lambda raw: parse_count(raw, name, minimum=minimum)


def _choice(enum: type[Any], name: str) -> Callable[[Any], Any]:
    def parse(raw: Any) -> Any:
        text = str(raw).strip().lower()
        try:
            return enum(text)
        except ValueError:
            valid = ", ".join(m.value for m in enum)
            raise UsageError(f"{name}={text!r} is not valid; choose one of: {valid}") from None

    return parse


def _words(values: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated options and comma/space separated environment values alike."""
    return tuple(v for value in values or () for v in value.replace(",", " ").split() if v)


# --------------------------------------------------------------------------------------------------
# the tables
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A table of options and the record (a frozen dataclass whose defaults are the options' defaults) they fill."""

    record: type[Any]
    params: Mapping[str, Param]


@dataclass(frozen=True)
class Param:
    """One option: its flags, environment variables, the type Typer sees, and how the value is parsed."""

    decls: tuple[str, ...]
    help: str
    envvar: tuple[str, ...] = ()
    type: Any = str | None  # what Typer parses the raw text into (str: podguard parses it itself)
    parse: Callable[[Any], Any] | None = None  # raw -> record value; None: as Typer gave it
    panel: str | None = PREFLIGHT_PANEL
    metavar: str | None = None

    def option(self, name: str) -> Any:
        envvar = list(self.envvar) or f"PODGUARD_{name.upper()}"
        info = typer.Option(
            *self.decls, envvar=envvar, help=self.help, rich_help_panel=self.panel, metavar=self.metavar
        )
        return Annotated[self.type, info]


PREFLIGHT = Group(
    PreflightOptions,
    {
        "gpu_list": Param(
            ("--gpu-list",),
            "GPUs to use: NVML indices or UUIDs, e.g. 0,1,2,3. Default: CUDA_VISIBLE_DEVICES, else all.",
            ("PODGUARD_GPU_LIST", "GPU_LIST"),
        ),
        "nproc_per_node": Param(
            ("--nproc-per-node",),
            "Use this many GPUs (caps the selection; more than selected fails unless --on-fewer-gpus continue).",
            ("PODGUARD_NPROC_PER_NODE", "NPROC_PER_NODE"),
            parse=_count("NPROC_PER_NODE", 1),
            metavar="N",
        ),
        "expect_gpus": Param(
            ("--expect-gpus",),
            "GPUs this node should have (default: RUNPOD_GPU_COUNT).",
            ("PODGUARD_EXPECT_GPUS", "RUNPOD_GPU_COUNT"),
            parse=_count("expect-gpus", 0),
            metavar="N",
        ),
        "on_fewer": Param(
            ("--on-fewer-gpus",),
            "fail (exit 69) or continue (loudly) when fewer GPUs than expected.",
            ("PODGUARD_ON_FEWER_GPUS",),
            type=str,
            parse=_choice(OnFewer, "on-fewer-gpus"),
            metavar="fail|continue",
        ),
        "require_gpu": Param(
            ("--require-gpu/--allow-cpu",), "No GPU at all is an error (69) instead of a CPU fallback.", type=bool
        ),
        "cleanup": Param(
            ("--cleanup/--no-cleanup",),
            "Stop leftover processes that hold the selected GPUs before starting.",
            type=bool,
        ),
        "dry_run": Param(("--dry-run",), "Report what would be stopped; kill nothing.", type=bool),
        "busy_timeout_s": Param(
            ("--busy-timeout",),
            "Seconds to wait for busy GPUs to become free before giving up (exit 75).",
            ("PODGUARD_BUSY_TIMEOUT",),
            type=str,
            parse=_seconds("--busy-timeout"),
            metavar="SECONDS",
        ),
        "grace_s": Param(
            ("--grace",),
            "Seconds between SIGTERM and SIGKILL when stopping processes.",
            ("PODGUARD_GRACE",),
            type=str,
            parse=_seconds("--grace"),
            metavar="SECONDS",
        ),
        "protect": Param(
            ("--protect",),
            "Process name never to stop (repeatable; added to sshd, jupyter, nginx, ...).",
            type=list[str] | None,
            parse=_words,
            metavar="NAME",
        ),
        "kill_patterns": Param(
            ("--kill-pattern",),
            "Launcher name (e.g. sglang, torchrun) whose job tree is stopped when one of its processes holds a GPU.",
            ("PODGUARD_KILL_PATTERN",),
            type=list[str] | None,
            parse=_words,
            metavar="NAME",
        ),
        "idle_memory_mib": Param(
            ("--idle-memory-mib",),
            "GPU memory in use at or below this, with no process, counts as idle.",
            type=str,
            parse=_whole("--idle-memory-mib"),
            metavar="MIB",
        ),
        "probe": Param(
            ("--probe",),
            "Health probe: cuda (a child allocates and runs a matmul on each GPU), off (NVML only), auto.",
            type=str,
            parse=_choice(ProbeMode, "PODGUARD_PROBE"),
            metavar="auto|cuda|off",
        ),
        "probe_cmd": Param(
            ("--probe-cmd",), "Your own probe program, run per GPU with only that GPU visible (exit 0 = healthy)."
        ),
        "probe_timeout_s": Param(
            ("--probe-timeout",),
            "Seconds before a hung probe is killed and its GPU marked unhealthy.",
            ("PODGUARD_PROBE_TIMEOUT",),
            type=str,
            parse=_seconds("--probe-timeout"),
            metavar="SECONDS",
        ),
        "max_temperature_margin_c": Param(
            ("--temperature-margin",),
            "Warn when a GPU is within this many degrees C of its slowdown temperature.",
            ("PODGUARD_TEMPERATURE_MARGIN",),
            type=str,
            parse=_whole("--temperature-margin"),
            metavar="DEGREES",
        ),
        "fail_on_warnings": Param(
            ("--fail-on-warnings",),
            "Treat gate warnings (slowdown, temperature, PCIe width, ECC off) as failures (76).",
            type=bool,
        ),
        "wait_for_gpus": Param(
            ("--wait-for-gpus",),
            "Wait (up to --busy-timeout) for GPUs leased by another podguard run instead of refusing (75).",
            type=bool,
            panel=LAUNCH_PANEL,
        ),
        "state_dir": Param(
            ("--state-dir",),
            "Where reports, logs, locks and leases live (default /workspace/.podguard when /workspace exists).",
            type=Path | None,
            panel=None,
        ),
        "dev_dir": Param(
            ("--dev-dir",), "Where the NVIDIA device files are looked for when finding GPU holders.", type=Path
        ),
    },
)

LAUNCH = Group(
    LaunchOptions,
    {
        "mode": Param(
            ("--mode",),
            "auto, single (one process, all selected GPUs), per-gpu (one process per GPU), torchrun, "
            "roles (a --job-file splits GPUs between roles).",
            type=str,
            parse=_choice(LaunchMode, "--mode"),
            metavar="auto|single|per-gpu|torchrun|roles",
            panel=LAUNCH_PANEL,
        ),
        "only_gpu": Param(
            ("--only-gpu",),
            "Show only this GPU's (or rank's) lines on the terminal; every line still goes to the log files.",
            parse=lambda raw: None if raw in (None, "") else _gpu_index(raw),
            metavar="GPU",
            panel=LAUNCH_PANEL,
        ),
        "prefix": Param(
            ("--prefix",),
            "Per-line prefix of per-gpu workers (default 'GPU{gpu}:', 'CPU{rank}:' without GPUs); fields: gpu, "
            "rank, local_rank, name.",
            panel=LAUNCH_PANEL,
        ),
        "on_exit": Param(
            ("--on-exit",),
            "After the job: exit (with its code), idle (keep the container alive), stop-pod (stop this RunPod pod).",
            type=str,
            parse=_choice(OnExit, "--on-exit"),
            metavar="exit|idle|stop-pod",
            panel=LAUNCH_PANEL,
        ),
        "rerun": Param(
            ("--rerun",),
            "Run again after a container restart even though the job already finished successfully.",
            type=bool,
            panel=LAUNCH_PANEL,
        ),
        "prepare": Param(
            ("--prepare",),
            "A command run once before any worker starts (cached by --cache-key; it writes to $PODGUARD_PREPARE_DIR, "
            "which workers also get).",
            panel=LAUNCH_PANEL,
        ),
        "cache_key": Param(
            ("--cache-key",),
            "KEY=VALUE that identifies the prepared data (model, dataset, context length, samples...); repeatable.",
            type=list[str] | None,
            parse=lambda values: tuple(values or ()),
            panel=LAUNCH_PANEL,
        ),
        "prepare_shared": Param(
            ("--prepare-shared",),
            "The prepare cache is on storage shared by all nodes: only node 0 prepares.",
            type=bool,
            panel=LAUNCH_PANEL,
        ),
        "job_file": Param(("--job-file",), "Roles job file (TOML).", type=Path | None, panel=LAUNCH_PANEL),
        "cpu_workers": Param(
            ("--cpu-workers",),
            "Workers to start on a node without GPUs (per-gpu and torchrun modes; the demo defaults to 2).",
            parse=_count("--cpu-workers", 1),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "nnodes": Param(
            ("--nnodes",),
            "Nodes in a multi-node torchrun job (default NUM_NODES).",
            ("PODGUARD_NNODES", "NUM_NODES"),
            parse=_count("--nnodes/NUM_NODES", 1),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "node_rank": Param(
            ("--node-rank",),
            "This node's rank (default NODE_RANK).",
            ("PODGUARD_NODE_RANK", "NODE_RANK"),
            parse=_count("--node-rank/NODE_RANK", 0),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "master_addr": Param(
            ("--master-addr",),
            "Rendezvous host (default PRIMARY_ADDR / MASTER_ADDR).",
            ("PODGUARD_MASTER_ADDR", "PRIMARY_ADDR", "MASTER_ADDR"),
            parse=lambda raw: raw or None,
            panel=LAUNCH_PANEL,
        ),
        "master_port": Param(
            ("--master-port",),
            "Rendezvous port (default: a free port distinct from other podguard runs).",
            ("PODGUARD_MASTER_PORT", "PRIMARY_PORT", "MASTER_PORT"),
            parse=lambda raw: None if raw in (None, "") else _port(raw),
            panel=LAUNCH_PANEL,
        ),
        "max_restarts": Param(
            ("--max-restarts",),
            "torchrun mode: worker group restarts before failing.",
            type=str,
            parse=_whole("--max-restarts"),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
    },
)


def _gpu_index(raw: Any) -> int:
    text = str(raw).strip()
    if not text.isdigit():
        raise UsageError(f"--only-gpu={raw!r} is not valid; expected a GPU index such as 2")
    return int(text)


def _port(raw: Any) -> int:
    return parse_int(raw, "MASTER_PORT", 1, 65535)


# --------------------------------------------------------------------------------------------------
# the decorator
# --------------------------------------------------------------------------------------------------


def _defaults(record: type[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(record):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def _typer_default(value: Any) -> Any:
    """A record default as Typer shows it: enums as their text, tuples as lists, None as is."""
    if isinstance(value, tuple):
        return list(value) or None
    if isinstance(value, str):  # StrEnum members included
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def options(group: Group, names: Sequence[str], *, into: str, **fixed: Any) -> Callable[[F], F]:
    """Add the options `names` of `group` to a Typer command and hand them over as one record in `into`.

    `fixed` sets record fields the command does not expose (e.g. `command="cleanup"`, `probe="off"`).
    The command's own parameters keep their place; the table's options follow them in `--help`.
    """
    record, table = group.record, group.params
    defaults = _defaults(record)
    unknown = [n for n in (*names, *fixed) if n not in defaults]
    if unknown:
        raise TypeError(f"{record.__name__} has no field(s) {unknown}")

    def decorate(func: F) -> F:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values() if p.name != into]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=_typer_default(defaults[name]),
                annotation=table[name].option(name),
            )
            for name in names
        ]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            kwargs[into] = build_record(group, values, fixed)
            return func(**kwargs)

        params = sorted([*own, *added], key=lambda p: p.kind)
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # type: ignore[attr-defined]  # Typer must see the new signature
        return command  # type: ignore[return-value]

    return decorate


def build_record(group: Group, values: Mapping[str, Any], fixed: Mapping[str, Any]) -> Any:
    """The record from parsed option values (each through its parser) and the command's fixed fields."""
    record = group.record
    kwargs: dict[str, Any] = {}
    for name, raw in values.items():
        parse = group.params[name].parse
        kwargs[name] = parse(raw) if parse is not None else raw
    if record is PreflightOptions:
        kwargs.setdefault("cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES"))
    kwargs.update(fixed)
    return record(**kwargs)

"""The roles job file (TOML): validate it and build each role's GPUs and WorkerSpecs.

    plan = load_roles("job.toml", selection, master_port=29500, log_dir=logs)
    plan.roles[0].name, plan.roles[0].gpus, plan.specs()

The file format, the GPU split and when a role counts as ready: docs/roles.md. Every mistake is a
`UsageError` (exit 64) naming the file, the key, the bad value and what is valid.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard.errors import UsageError
from podguard.launch.modes import DEFAULT_MASTER_ADDR, gpu_labels, job_env, log_path, per_gpu_specs, visible_env
from podguard.launch.ports import parse_port
from podguard.launch.prefix import ROLE_PREFIX_FIELDS, check_format
from podguard.launch.roles.gpus import allocate, order_check
from podguard.launch.spec import WorkerSpec

if TYPE_CHECKING:
    from podguard.gpu.selected import SelectedGpu, Selection

__all__ = ["DEFAULT_READY_TIMEOUT_S", "ReadyCheck", "ReadyKind", "Role", "RolesPlan", "load_roles", "parse_roles"]

DEFAULT_READY_TIMEOUT_S = 600.0
_ROLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_URL = re.compile(r"^https?://[^/\s]+")
_JOB_KEYS = {"ready_timeout"}
_ROLE_KEYS = {
    "command", "gpus", "per_gpu", "after", "ready", "service", "env", "cwd", "prefix", "nproc", "master_port",
}  # fmt: skip
_READY_KEYS = {"log", "url", "timeout"}


class ReadyKind(StrEnum):
    LOG = "log"  # every worker of the role printed a line matching a regex
    URL = "url"  # a URL answers 2xx/3xx


@dataclass(frozen=True)
class ReadyCheck:
    kind: ReadyKind
    target: str  # the regex or the URL
    timeout_s: float

    def describe(self) -> str:
        return f"log line /{self.target}/" if self.kind is ReadyKind.LOG else f"{self.target} to answer"


@dataclass(frozen=True)
class Role:
    name: str
    command: tuple[str, ...]
    gpus: tuple[SelectedGpu, ...]
    per_gpu: bool
    after: tuple[str, ...]
    ready: ReadyCheck | None
    service: bool
    specs: tuple[WorkerSpec, ...] = ()


@dataclass(frozen=True)
class RolesPlan:
    roles: tuple[Role, ...]  # in file order
    source: str  # the file name, for messages

    def specs(self) -> list[WorkerSpec]:
        """Every role's WorkerSpecs, in file order (e.g. for `only_for_gpu`)."""
        return [s for r in self.roles for s in r.specs]

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)


class _Errors:
    """One-line UsageErrors that name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, key: str, problem: str) -> UsageError:
        return UsageError(f"{self.source}: {key} {problem}")


@dataclass(frozen=True)
class _Context:
    """What every role is built against."""

    err: _Errors
    selection: Selection
    master_addr: str
    log_dir: Path | None
    base_dir: Path | None
    default_timeout: float


# --------------------------------------------------------------------------------------------------
# Values


def _check_keys(err: _Errors, where: str, table: Mapping[str, Any], valid: Collection[str]) -> None:
    for key in table:
        if key not in valid:
            raise err(f"{where}.{key}" if where else key, f"is not a known key; valid keys: {', '.join(sorted(valid))}")


def _seconds(err: _Errors, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise err(key, f"= {value!r} is not valid; expected a number of seconds > 0")
    return float(value)


def _command(err: _Errors, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise err(key, f"= {value!r} cannot be split into words ({exc})") from None
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        argv = list(value)
    else:
        raise err(key, f"= {value!r} is not valid; expected a list of strings or one command string")
    if not argv or not argv[0]:
        raise err(key, 'is empty; give the program and its arguments, e.g. ["python", "train.py"]')
    return tuple(argv)


def _ready(err: _Errors, key: str, value: Any, default_timeout: float) -> ReadyCheck | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise err(key, f'= {value!r} is not valid; expected a table: {{log = "REGEX"}} or {{url = "http://..."}}')
    _check_keys(err, key, value, _READY_KEYS)
    kinds = [k for k in ReadyKind if k.value in value]
    if len(kinds) != 1:
        raise err(key, 'needs exactly one of log = "REGEX" or url = "http://..."')
    kind = kinds[0]
    target = value[kind.value]
    if not isinstance(target, str) or not target:
        raise err(f"{key}.{kind}", f"= {target!r} is not valid; expected a non-empty string")
    if kind is ReadyKind.LOG:
        try:
            re.compile(target)
        except re.error as exc:
            raise err(f"{key}.log", f"= {target!r} is not a valid regular expression ({exc})") from None
    elif not _URL.match(target):
        raise err(f"{key}.url", f"= {target!r} is not valid; expected an http:// or https:// URL")
    timeout = _seconds(err, f"{key}.timeout", value["timeout"]) if "timeout" in value else default_timeout
    return ReadyCheck(kind, target, timeout)


def _flag(err: _Errors, key: str, table: Mapping[str, Any], name: str) -> bool | None:
    value = table.get(name)
    if value is not None and not isinstance(value, bool):
        raise err(f"{key}.{name}", f"= {value!r} is not valid; expected true or false")
    return value


def _env(err: _Errors, key: str, table: Mapping[str, Any]) -> dict[str, str]:
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise err(f"{key}.env", f'= {env!r} is not valid; expected a table of strings, e.g. {{ KEY = "value" }}')
    return dict(env)


def _cwd(err: _Errors, key: str, table: Mapping[str, Any], base_dir: Path | None) -> Path | None:
    cwd = table.get("cwd")
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd:
        raise err(f"{key}.cwd", f"= {cwd!r} is not valid; expected a directory path")
    return Path(cwd) if Path(cwd).is_absolute() or base_dir is None else base_dir / cwd


def _nproc(err: _Errors, key: str, table: Mapping[str, Any]) -> int:
    nproc = table.get("nproc", 1)
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise err(f"{key}.nproc", f"= {nproc!r} is not valid; expected a whole number >= 1")
    return nproc


def _prefix(err: _Errors, key: str, table: Mapping[str, Any], default: str) -> str:
    fmt = table.get("prefix", default)
    if not isinstance(fmt, str):
        raise err(f"{key}.prefix", f'= {fmt!r} is not valid; expected a format string such as "{default}"')
    check_format(fmt, ROLE_PREFIX_FIELDS, f"{err.source}: {key}.prefix")
    return fmt


# --------------------------------------------------------------------------------------------------
# Workers


class _PortSlots:
    """per_gpu roles get the caller's master port + 0, 1, ... in file order unless they set their own."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.next = 0

    def take(self, err: _Errors, key: str, table: Mapping[str, Any]) -> int:
        if "master_port" in table:
            return parse_port(table["master_port"], "MASTER_PORT")
        port = self.base + self.next
        self.next += 1
        if port > 65535:
            raise err(f"{key}.master_port", "is needed: the caller's master port + offset exceeds 65535")
        return port


@dataclass(frozen=True)
class _Shape:
    """The validated keys of one role that decide its workers."""

    name: str
    command: tuple[str, ...]
    gpus: tuple[SelectedGpu, ...]
    env: dict[str, str]
    cwd: Path | None
    service: bool
    nproc: int  # CPU workers of a per_gpu role that gets no GPU


def _per_gpu_specs(ctx: _Context, shape: _Shape, table: Mapping[str, Any], port: int) -> list[WorkerSpec]:
    """One worker per GPU of the role (or `nproc` CPU workers), named `role.RANK`."""
    key = f"roles.{shape.name}"
    fmt = _prefix(ctx.err, key, table, "{role}:GPU{gpu}:" if shape.gpus else "{role}:CPU{rank}:")
    base = per_gpu_specs(
        shape.command,
        dataclasses.replace(ctx.selection, gpus=shape.gpus),
        master_port=port,
        master_addr=ctx.master_addr,
        nproc=shape.nproc if not shape.gpus else None,
        env={**shape.env, "PODGUARD_ROLE": shape.name},
        cwd=shape.cwd,
    )
    specs = []
    for spec in base:
        rank = int(spec.env["RANK"])
        gpu = spec.name.removeprefix("GPU") if shape.gpus else "cpu"
        name = f"{shape.name}.{rank}"
        specs.append(
            dataclasses.replace(
                spec,
                name=name,
                env={**spec.env, "PODGUARD_WORKER": name},
                prefix=fmt.format(role=shape.name, gpu=gpu, rank=rank, local_rank=rank, name=name),
                log_path=log_path(ctx.log_dir, name),
                service=shape.service,
                label=f"role {shape.name} rank {rank}" + (f" (GPU{gpu})" if shape.gpus else ""),
            )
        )
    return specs


def _single_spec(ctx: _Context, shape: _Shape, table: Mapping[str, Any]) -> WorkerSpec:
    """One process that sees every GPU of the role, named after the role."""
    fmt = _prefix(ctx.err, f"roles.{shape.name}", table, "{role}:")
    labels = ",".join(gpu_labels(shape.gpus))
    name = shape.name
    return WorkerSpec(
        name=name,
        argv=shape.command,
        env={**job_env(1), **visible_env(shape.gpus), **shape.env, "PODGUARD_ROLE": name, "PODGUARD_WORKER": name},
        prefix=fmt.format(role=name, gpu=labels, rank=0, local_rank=0, name=name),
        log_path=log_path(ctx.log_dir, name),
        cwd=shape.cwd,
        service=shape.service,
        label=f"role {name}" + (f" (GPU {labels})" if shape.gpus else ""),
        gpus=tuple(dict.fromkeys(g.index for g in shape.gpus)),
    )


def _build_role(
    ctx: _Context, name: str, table: Mapping[str, Any], gpus: tuple[SelectedGpu, ...], after: tuple[str, ...],
    ports: _PortSlots,
) -> Role:  # fmt: skip
    err, key = ctx.err, f"roles.{name}"
    command = _command(err, f"{key}.command", table["command"])
    ready = _ready(err, f"{key}.ready", table.get("ready"), ctx.default_timeout)
    per_gpu = bool(_flag(err, key, table, "per_gpu"))
    service = _flag(err, key, table, "service")
    shape = _Shape(
        name=name,
        command=command,
        gpus=gpus,
        env=_env(err, key, table),
        cwd=_cwd(err, key, table, ctx.base_dir),
        service=service if service is not None else ready is not None,
        nproc=_nproc(err, key, table),
    )
    if per_gpu:
        specs = _per_gpu_specs(ctx, shape, table, ports.take(err, key, table))
    else:
        specs = [_single_spec(ctx, shape, table)]
    return Role(name, command, gpus, per_gpu, after, ready, shape.service, tuple(specs))


# --------------------------------------------------------------------------------------------------
# The file


def _job_timeout(err: _Errors, data: Mapping[str, Any]) -> float:
    """The [job] table: the default ready timeout."""
    job = data.get("job", {})
    if not isinstance(job, dict):
        raise err("job", "must be a table ([job])")
    _check_keys(err, "job", job, _JOB_KEYS)
    if "ready_timeout" in job:
        return _seconds(err, "job.ready_timeout", job["ready_timeout"])
    return DEFAULT_READY_TIMEOUT_S


def _role_tables(err: _Errors, data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The [roles.NAME] tables, with valid names, known keys and a command each."""
    raw = data.get("roles")
    if not isinstance(raw, dict) or not raw:
        raise err("roles", 'are missing; define at least one, e.g. [roles.train] command = ["python", "train.py"]')
    for name, table in raw.items():
        if not _ROLE_NAME.match(name):
            raise err(
                f"roles.{name}", "is not a valid role name; use letters, digits, '_' and '-', starting with a letter"
            )
        if not isinstance(table, dict):
            raise err(f"roles.{name}", "must be a table ([roles.NAME] with command = [...])")
        _check_keys(err, f"roles.{name}", table, _ROLE_KEYS)
        if "command" not in table:
            raise err(f"roles.{name}.command", 'is missing; e.g. command = ["python", "train.py"]')
    return raw


def parse_roles(
    data: Mapping[str, Any],
    selection: Selection,
    *,
    master_port: int | str,
    master_addr: str = DEFAULT_MASTER_ADDR,
    log_dir: Path | None = None,
    source: str = "job file",
    base_dir: Path | None = None,
) -> RolesPlan:
    """Validate a parsed job file and build its plan (roles with their GPUs and WorkerSpecs)."""
    err = _Errors(source)
    _check_keys(err, "", data, {"job", "roles"})
    ctx = _Context(err, selection, master_addr, log_dir, base_dir, _job_timeout(err, data))
    tables = _role_tables(err, data)
    after = order_check(err, tables)
    gpus = allocate(err, tables, selection)
    ports = _PortSlots(parse_port(master_port, "MASTER_PORT"))
    roles = [_build_role(ctx, name, table, gpus.get(name, ()), after[name], ports) for name, table in tables.items()]
    return RolesPlan(tuple(roles), source)


def load_roles(
    job_file: str | os.PathLike[str],
    selection: Selection,
    *,
    master_port: int | str,
    master_addr: str = DEFAULT_MASTER_ADDR,
    log_dir: Path | None = None,
) -> RolesPlan:
    """Read and validate a TOML job file (UsageError, exit 64, on any mistake)."""
    path = Path(job_file)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"job file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise UsageError(f"job file {str(path)!r} cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"job file {str(path)!r} is not valid TOML: {exc}") from None
    return parse_roles(
        data, selection, master_port=master_port, master_addr=master_addr, log_dir=log_dir, source=str(path),
        base_dir=path.parent,
    )  # fmt: skip

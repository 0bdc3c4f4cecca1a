"""Launch modes: turn the preflight's `Selection` and the user's command into `WorkerSpec`s.

* **single** — `single_spec()`: one process that sees exactly the selected GPUs (by UUID).
* **per-gpu** — `per_gpu_specs()`: one process per selected GPU, each seeing only its own GPU, with
  RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT set (torch's `env://`
  contract, so `init_process_group()` needs no arguments), output prefixed `GPU{index}:` (the seed's
  format; any `prefix_format` with `{gpu}`, `{rank}`, `{local_rank}`, `{name}`), one log file per
  worker. On a CPU-only node: `nproc` CPU workers (default 1), prefixed `CPU{rank}:`.
* **roles** — `load_roles()` / `run_roles()`: a TOML job file splits the selected GPUs between roles
  (below).
* **auto** — `pick_mode()`: torchrun when the command is a Python training script and more than one
  GPU is selected, single otherwise; it returns the reason it gives the user. (The torchrun spec itself
  is `podguard.launch.torchrun.build_torchrun_spec`; the caller dispatches on the returned name.)

Every worker gets `PYTHONUNBUFFERED=1` unless the user set it: a Python child writing to a pipe
block-buffers its output, which would make logs arrive in bursts and lose the last lines of a rank
that crashes — the lines a failure summary needs most. `OMP_NUM_THREADS` defaults to
`cpus // workers` (torchrun's reason for setting it: N processes each spawning one thread per core
oversubscribe the CPU), again only where the user did not set it.

Roles job file (TOML; `tomllib` is in the standard library)::

    [job]                                  # optional
    ready_timeout = 600                    # default seconds a role may take to become ready

    [roles.server]
    command = ["python", "-m", "sglang.launch_server", "--port", "30000"]   # list, or one string
    gpus = 1                               # N, "rest", or a list of GPU indices, e.g. [0]; default 0
    ready = { url = "http://127.0.0.1:30000/health" }   # or { log = "Uvicorn running" }, + timeout
    env = { SGLANG_LOG_LEVEL = "info" }    # optional, added to the environment
    # service = true                       # default: true when `ready` is set (see below)

    [roles.trainer]
    command = "python train.py --server http://127.0.0.1:30000"
    gpus = "rest"
    after = ["server"]                     # start once these roles are ready
    per_gpu = true                         # one process per GPU with RANK/WORLD_SIZE/MASTER_* set

Other role keys: `cwd`, `prefix` (format with `{role}`, `{rank}`, `{local_rank}`, `{gpu}`, `{name}`),
`nproc` (CPU workers of a `per_gpu` role that gets no GPU), `master_port` (per_gpu roles get the
caller's master port + 0, 1, … in file order unless they set one).

GPU split: explicit index lists are taken first, then counts in file order from what is left (in the
selection's order), then `"rest"` (at most one role) gets the remainder. Asking for more than is
selected is an error.

When is a role *ready* (what `after` waits for)?

* `ready = {log = REGEX}`: when every worker of the role printed a line matching REGEX;
* `ready = {url = URL}`: when URL answers 2xx/3xx (polled with backoff 0.1 s → 2 s, proxies ignored);
* no `ready`, `service = true`: as soon as it started;
* no `ready`, not a service: when all its workers exited 0 — a one-shot step such as a download.

A role that is not ready within its timeout fails the job with exit code 124 (`READY_TIMEOUT_EXIT`,
the convention of coreutils' `timeout`). Services (`service = true`, the default for roles with
`ready`) are expected to run until the job is done: when every other worker has finished successfully
they are stopped and the job succeeds; a service that exits before that fails the job. Any failing
worker fails the job (fail fast, see `supervisor.py`). Mistakes in the file are `UsageError`s (exit
64) naming the key, the bad value and what is valid.
"""

from __future__ import annotations

import os
import re
import shlex
import string
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from podguard.errors import UsageError
from podguard.launch.printer import LineCallback
from podguard.launch.process import Worker
from podguard.launch.spec import JobOutcome, WorkerSpec
from podguard.launch.supervisor import DEFAULT_GRACE_S, Controller, Supervisor, check_specs
from podguard.preflight.selection import SelectedGpu, Selection

MODES = ("auto", "single", "per-gpu", "torchrun", "roles")
DEFAULT_PREFIX = "GPU{gpu}:"
DEFAULT_CPU_PREFIX = "CPU{rank}:"
PREFIX_FIELDS = ("gpu", "rank", "local_rank", "name")
ROLE_PREFIX_FIELDS = ("role", "gpu", "rank", "local_rank", "name")
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_READY_TIMEOUT_S = 600.0
READY_TIMEOUT_EXIT = 124
SINGLE_NAME = "job"

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
_LAUNCHERS = {"torchrun", "accelerate", "deepspeed", "mpirun", "srun", "colossalai"}
_LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch"}
_ROLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


# --------------------------------------------------------------------------------------------------
# Shared helpers


def validate_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"mode {mode!r} is not valid; choose one of: {', '.join(MODES)}")
    return mode


def parse_master_port(port: int | str) -> int:
    try:
        value = int(str(port).strip())
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise UsageError(f"MASTER_PORT={port!r} is not valid; expected a port number 1-65535")
    return value


def check_format(fmt: str, fields: Sequence[str], what: str) -> None:
    """A prefix format may only use the documented fields; UsageError otherwise."""
    valid = ", ".join("{" + f + "}" for f in fields)
    try:
        used = [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]
    except ValueError as exc:
        raise UsageError(f"{what} {fmt!r} is not a valid format ({exc}); it may use {valid}") from None
    for name in used:
        if name not in fields:
            raise UsageError(f"{what} {fmt!r} uses unknown field {{{name}}}; it may use {valid}")
    try:
        fmt.format(**dict.fromkeys(fields, "0"))
    except (ValueError, IndexError, KeyError) as exc:
        raise UsageError(f"{what} {fmt!r} is not a valid format ({exc}); it may use {valid}") from None


def _job_env(workers: int) -> dict[str, str]:
    """Defaults every launched job gets unless the user's environment sets them (see docstring)."""
    env: dict[str, str] = {}
    if "PYTHONUNBUFFERED" not in os.environ:
        env["PYTHONUNBUFFERED"] = "1"
    if "OMP_NUM_THREADS" not in os.environ and workers > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    return env


def _gpu_labels(gpus: Sequence[SelectedGpu]) -> list[str]:
    """'2' for a whole GPU; '2.0', '2.1' for the MIG slices of one physical GPU."""
    counts: dict[int, int] = {}
    for gpu in gpus:
        counts[gpu.index] = counts.get(gpu.index, 0) + 1
    seen: dict[int, int] = {}
    labels = []
    for gpu in gpus:
        if counts[gpu.index] > 1:
            labels.append(f"{gpu.index}.{seen.get(gpu.index, 0)}")
            seen[gpu.index] = seen.get(gpu.index, 0) + 1
        else:
            labels.append(str(gpu.index))
    return labels


def _log_path(log_dir: Path | None, name: str) -> Path | None:
    return Path(log_dir) / f"{name}.log" if log_dir is not None else None


def _visible(gpus: Sequence[SelectedGpu]) -> dict[str, str]:
    if not gpus:
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {"CUDA_VISIBLE_DEVICES": ",".join(g.visible_id for g in gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


# --------------------------------------------------------------------------------------------------
# single and per-gpu


def single_spec(
    argv: Sequence[str],
    selection: Selection,
    *,
    log_dir: Path | None = None,
    prefix: str = "",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> WorkerSpec:
    """One process seeing exactly the selected GPUs (none on a CPU-only node)."""
    if not argv:
        raise UsageError("single mode needs a command, e.g. `podguard run -- python serve.py`")
    child = {**_job_env(1), **selection.child_env(), **(env or {})}
    gpus = ",".join(_gpu_labels(selection.gpus)) or "none"
    return WorkerSpec(
        name=SINGLE_NAME,
        argv=tuple(argv),
        env=child,
        prefix=prefix,
        log_path=_log_path(log_dir, SINGLE_NAME),
        cwd=cwd,
        label=f"the job (GPUs {gpus})" if selection.gpus else "the job (CPU only)",
        gpus=tuple(selection.indices),
    )


def per_gpu_specs(
    argv: Sequence[str],
    selection: Selection,
    *,
    master_port: int | str,
    master_addr: str = DEFAULT_MASTER_ADDR,
    prefix_format: str | None = None,
    log_dir: Path | None = None,
    nproc: int | None = None,
    node_rank: int = 0,
    nnodes: int = 1,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[WorkerSpec]:
    """One worker per selected GPU (or `nproc` CPU workers on a CPU-only node); see the docstring.

    Ranks: RANK = node_rank * workers + local rank, WORLD_SIZE = nnodes * workers (every node must run
    the same number of workers, as with torchrun's `--nproc-per-node`).
    """
    if not argv:
        raise UsageError("per-gpu mode needs a command, e.g. `podguard train --mode per-gpu -- python train.py`")
    port = parse_master_port(master_port)
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"node rank {node_rank} of {nnodes} node(s) is not valid; expected 0 <= node rank < nodes")
    cpu = selection.cpu_only
    if cpu:
        count = 1 if nproc is None else nproc
        if count < 1:
            raise UsageError(f"nproc={nproc} is not valid; expected at least 1 CPU worker")
        labels = ["cpu"] * count
    else:
        count = len(selection.gpus)
        labels = _gpu_labels(selection.gpus)
    fmt = prefix_format if prefix_format is not None else (DEFAULT_CPU_PREFIX if cpu else DEFAULT_PREFIX)
    check_format(fmt, PREFIX_FIELDS, "prefix format")
    common = {
        **_job_env(count),
        "WORLD_SIZE": str(count * nnodes),
        "LOCAL_WORLD_SIZE": str(count),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "GROUP_RANK": str(node_rank),
    }
    specs = []
    for local in range(count):
        rank = node_rank * count + local
        name = f"CPU{local}" if cpu else f"GPU{labels[local]}"
        child = dict(common)
        child.update({"CUDA_VISIBLE_DEVICES": ""} if cpu else selection.child_env_for(local))
        child.update(RANK=str(rank), LOCAL_RANK=str(local), PODGUARD_WORKER=name)
        child.update(env or {})
        specs.append(
            WorkerSpec(
                name=name,
                argv=tuple(argv),
                env=child,
                prefix=fmt.format(gpu=labels[local], rank=rank, local_rank=local, name=name),
                log_path=_log_path(log_dir, name),
                cwd=cwd,
                label=f"{name} (rank {rank})",
                gpus=() if cpu else (selection.gpus[local].index,),
            )
        )
    return specs


def only_for_gpu(specs: Sequence[WorkerSpec], gpu: int | str) -> set[str]:
    """Worker names for `--only-gpu N`: the worker(s) on GPU N (CPU workers: N is the CPU rank)."""
    text = str(gpu).strip()
    if not text.isdigit():
        raise UsageError(f"--only-gpu {gpu!r} is not valid; expected a GPU index such as 0")
    index = int(text)
    names = {s.name for s in specs if index in s.gpus and len(s.gpus) == 1}
    names |= {s.name for s in specs if not s.gpus and s.name == f"CPU{index}"}
    if not names:
        own = sorted({i for s in specs if len(s.gpus) == 1 for i in s.gpus})
        cpus = sorted(s.name for s in specs if not s.gpus and s.name.startswith("CPU"))
        valid = ", ".join(str(i) for i in own) or ", ".join(c.removeprefix("CPU") for c in cpus)
        if not valid:
            raise UsageError(f"--only-gpu {index}: no worker runs on a single GPU in this mode; use per-gpu or roles")
        raise UsageError(f"--only-gpu {index}: no worker runs on GPU {index}; valid: {valid}")
    return names


# --------------------------------------------------------------------------------------------------
# auto


@dataclass(frozen=True)
class ModeChoice:
    mode: str  # "single" or "torchrun"
    reason: str  # one line for the user: what was picked and why


def is_python_training_command(argv: Sequence[str]) -> tuple[bool, str]:
    """(True, what) for `python x.py`, `x.py`, `python -m pkg`; (False, why not) otherwise."""
    if not argv:
        return False, "there is no command"
    first = os.path.basename(argv[0])
    if first in _LAUNCHERS:
        return False, f"the command is a launcher itself ({first})"
    if first.endswith(".py"):
        return True, f"a Python script ({first})"
    if not _PYTHON_RE.match(first):
        return False, f"{first!r} is not a Python script"
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "-m":
            module = argv[i + 1] if i + 1 < len(argv) else ""
            if module in _LAUNCHER_MODULES:
                return False, f"the command is a launcher itself (python -m {module})"
            return (True, f"a Python module (python -m {module})") if module else (False, "python -m without a module")
        if tok == "-c":
            return False, "inline Python (python -c) is run as is"
        if tok in ("-X", "-W"):
            i += 2
            continue
        if not tok.startswith("-"):
            return True, f"a Python script ({os.path.basename(tok)})"
        i += 1
    return False, "a bare Python interpreter"


def pick_mode(argv: Sequence[str], selection: Selection) -> ModeChoice:
    """The `auto` mode's decision, with the sentence that explains it."""
    n = len(selection.gpus)
    script, what = is_python_training_command(argv)
    if n <= 1:
        where = "no GPU is selected (CPU only)" if n == 0 else "one GPU is selected"
        return ModeChoice("single", f"mode auto -> single: {where}, so the command runs once as is")
    if script:
        return ModeChoice(
            "torchrun", f"mode auto -> torchrun: {n} GPUs are selected and the command is {what}; one rank per GPU"
        )
    return ModeChoice(
        "single", f"mode auto -> single: {what}, so it runs once and sees all {n} GPUs (use --mode per-gpu to split)"
    )


# --------------------------------------------------------------------------------------------------
# roles: the job file


@dataclass(frozen=True)
class ReadyCheck:
    kind: str  # "log" or "url"
    target: str  # the regex or the URL
    timeout_s: float

    def describe(self) -> str:
        return f"log line /{self.target}/" if self.kind == "log" else f"{self.target} to answer"


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


_JOB_KEYS = {"ready_timeout"}
_ROLE_KEYS = {
    "command", "gpus", "per_gpu", "after", "ready", "service", "env", "cwd", "prefix", "nproc", "master_port",
}  # fmt: skip
_READY_KEYS = {"log", "url", "timeout"}


class _Errors:
    """One-line UsageErrors that name the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, key: str, problem: str) -> UsageError:
        return UsageError(f"{self.source}: {key} {problem}")


def _valid_keys(valid: Collection[str]) -> str:
    return ", ".join(sorted(valid))


def _check_keys(err: _Errors, where: str, table: Mapping[str, Any], valid: Collection[str]) -> None:
    for key in table:
        if key not in valid:
            raise err(f"{where}.{key}" if where else key, f"is not a known key; valid keys: {_valid_keys(valid)}")


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
    kinds = [k for k in ("log", "url") if k in value]
    if len(kinds) != 1:
        raise err(key, 'needs exactly one of log = "REGEX" or url = "http://..."')
    kind = kinds[0]
    target = value[kind]
    if not isinstance(target, str) or not target:
        raise err(f"{key}.{kind}", f"= {target!r} is not valid; expected a non-empty string")
    if kind == "log":
        try:
            re.compile(target)
        except re.error as exc:
            raise err(f"{key}.log", f"= {target!r} is not a valid regular expression ({exc})") from None
    elif not re.match(r"^https?://[^/\s]+", target):
        raise err(f"{key}.url", f"= {target!r} is not valid; expected an http:// or https:// URL")
    timeout = _seconds(err, f"{key}.timeout", value["timeout"]) if "timeout" in value else default_timeout
    return ReadyCheck(kind, target, timeout)


def _allocate(err: _Errors, raw: dict[str, dict[str, Any]], selection: Selection) -> dict[str, tuple[SelectedGpu, ...]]:
    """Split the selected GPUs between roles: explicit lists, then counts in file order, then "rest"."""
    free = list(selection.gpus)
    selected = ", ".join(str(i) for i in dict.fromkeys(selection.indices)) or "none (CPU only)"
    out: dict[str, tuple[SelectedGpu, ...]] = {}
    asks: list[str] = []
    rest: str | None = None
    valid = 'a whole number >= 0, "rest", or a list of selected GPU indices such as [0, 1]'
    for name, table in raw.items():
        value = table.get("gpus", 0)
        key = f"roles.{name}.gpus"
        if isinstance(value, list):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise err(key, f"= {value!r} is not valid; expected {valid}")
            chosen = []
            for index in value:
                matches = [g for g in free if g.index == index]
                if not matches:
                    taken = index in selection.indices
                    why = "is given to another role" if taken else f"is not selected (selected: {selected})"
                    raise err(key, f"= {value!r}: GPU {index} {why}")
                for g in matches:
                    free.remove(g)
                chosen.extend(matches)
            out[name] = tuple(chosen)
            asks.append(f"{name} {len(chosen)}")
    for name, table in raw.items():
        value = table.get("gpus", 0)
        key = f"roles.{name}.gpus"
        if isinstance(value, list):
            continue
        if value == "rest":
            if rest is not None:
                raise err(key, f'= "rest" is also used by role {rest!r}; only one role may take the rest')
            rest = name
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise err(key, f"= {value!r} is not valid; expected {valid}")
        asks.append(f"{name} {value}")
        if value > len(free):
            total = sum(int(a.rsplit(" ", 1)[1]) for a in asks)
            raise err(
                "roles",
                f"ask for {total} GPU(s) ({', '.join(asks)}) but {len(selection.gpus)} are selected ({selected})",
            )
        out[name] = tuple(free[:value])
        del free[:value]
    if rest is not None:
        if not free and not selection.cpu_only:
            raise err(f"roles.{rest}.gpus", f'= "rest" gets no GPU: the other roles take all selected ({selected})')
        out[rest] = tuple(free)
    return out


def _order_check(err: _Errors, raw: dict[str, dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    after: dict[str, tuple[str, ...]] = {}
    for name, table in raw.items():
        value = table.get("after", [])
        key = f"roles.{name}.after"
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise err(key, f"= {value!r} is not valid; expected a list of role names")
        for dep in value:
            if dep not in raw:
                raise err(key, f"= {value!r} names unknown role {dep!r}; roles are: {', '.join(raw)}")
        after[name] = tuple(dict.fromkeys(value))
    # cycles: depth-first search with colours
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in after[node]:
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise err("roles", f"'after' forms a cycle: {' -> '.join(cycle)}; no role in it could ever start")
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for name in raw:
        if name not in state:
            visit(name)
    return after


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
    job = data.get("job", {})
    if not isinstance(job, dict):
        raise err("job", "must be a table ([job])")
    _check_keys(err, "job", job, _JOB_KEYS)
    default_timeout = (
        _seconds(err, "job.ready_timeout", job["ready_timeout"]) if "ready_timeout" in job else DEFAULT_READY_TIMEOUT_S
    )
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
    after = _order_check(err, raw)
    gpus = _allocate(err, raw, selection)
    base_port = parse_master_port(master_port)
    roles: list[Role] = []
    port_slot = 0
    for name, table in raw.items():
        key = f"roles.{name}"
        command = _command(err, f"{key}.command", table["command"])
        ready = _ready(err, f"{key}.ready", table.get("ready"), default_timeout)
        flags = {}
        for flag in ("per_gpu", "service"):
            if flag in table and not isinstance(table[flag], bool):
                raise err(f"{key}.{flag}", f"= {table[flag]!r} is not valid; expected true or false")
            flags[flag] = table.get(flag)
        per_gpu = bool(flags["per_gpu"])
        service = flags["service"] if flags["service"] is not None else ready is not None
        env = table.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise err(f"{key}.env", f'= {env!r} is not valid; expected a table of strings, e.g. {{ KEY = "value" }}')
        cwd = table.get("cwd")
        if cwd is not None:
            if not isinstance(cwd, str) or not cwd:
                raise err(f"{key}.cwd", f"= {cwd!r} is not valid; expected a directory path")
            cwd_path = Path(cwd) if Path(cwd).is_absolute() or base_dir is None else base_dir / cwd
        else:
            cwd_path = None
        nproc = table.get("nproc", 1)
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise err(f"{key}.nproc", f"= {nproc!r} is not valid; expected a whole number >= 1")
        role_gpus = gpus.get(name, ())
        if per_gpu:
            if "master_port" in table:
                port = parse_master_port(table["master_port"])
            else:
                port = base_port + port_slot
                port_slot += 1
                if port > 65535:
                    raise err(f"{key}.master_port", "is needed: the caller's master port + offset exceeds 65535")
            default_fmt = "{role}:GPU{gpu}:" if role_gpus else "{role}:CPU{rank}:"
            fmt = table.get("prefix", default_fmt)
            if not isinstance(fmt, str):
                raise err(f"{key}.prefix", f'= {fmt!r} is not valid; expected a format string such as "{default_fmt}"')
            check_format(fmt, ROLE_PREFIX_FIELDS, f"{source}: {key}.prefix")
            sub = Selection(gpus=role_gpus, source=selection.source, inventory_count=selection.inventory_count)
            base = per_gpu_specs(
                command,
                sub,
                master_port=port,
                master_addr=master_addr,
                nproc=nproc if not role_gpus else None,
                env={**env, "PODGUARD_ROLE": name},
                cwd=cwd_path,
            )
            specs = []
            for spec in base:
                rank = int(spec.env["RANK"])
                gpu = spec.name.removeprefix("GPU") if role_gpus else "cpu"
                wname = f"{name}.{rank}"
                specs.append(
                    WorkerSpec(
                        name=wname,
                        argv=spec.argv,
                        env={**spec.env, "PODGUARD_WORKER": wname},
                        prefix=fmt.format(role=name, gpu=gpu, rank=rank, local_rank=rank, name=wname),
                        log_path=_log_path(log_dir, wname),
                        cwd=cwd_path,
                        service=service,
                        label=f"role {name} rank {rank}" + (f" (GPU{gpu})" if role_gpus else ""),
                        gpus=spec.gpus,
                    )
                )
        else:
            fmt = table.get("prefix", "{role}:")
            if not isinstance(fmt, str):
                raise err(f"{key}.prefix", f'= {fmt!r} is not valid; expected a format string such as "{{role}}:"')
            check_format(fmt, ROLE_PREFIX_FIELDS, f"{source}: {key}.prefix")
            labels = ",".join(_gpu_labels(role_gpus))
            child = {**_job_env(1), **_visible(role_gpus), **env, "PODGUARD_ROLE": name, "PODGUARD_WORKER": name}
            specs = [
                WorkerSpec(
                    name=name,
                    argv=command,
                    env=child,
                    prefix=fmt.format(role=name, gpu=labels, rank=0, local_rank=0, name=name),
                    log_path=_log_path(log_dir, name),
                    cwd=cwd_path,
                    service=service,
                    label=f"role {name}" + (f" (GPU {labels})" if role_gpus else ""),
                    gpus=tuple(dict.fromkeys(g.index for g in role_gpus)),
                )
            ]
        roles.append(Role(name, command, role_gpus, per_gpu, after[name], ready, service, tuple(specs)))
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
    import tomllib  # lazily: only the roles mode needs it

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
        data,
        selection,
        master_port=master_port,
        master_addr=master_addr,
        log_dir=log_dir,
        source=str(path),
        base_dir=path.parent,
    )


# --------------------------------------------------------------------------------------------------
# roles: running


def _poll_url(url: str, stop: threading.Event, on_ready: Callable[[], None]) -> None:
    """Poll `url` until it answers 2xx/3xx; backoff 0.1 s doubling to 2 s. No proxies: it is local."""
    import urllib.error  # lazily: 30 ms of imports that only the roles mode needs
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    delay = 0.1
    while not stop.is_set():
        try:
            with opener.open(url, timeout=2.0) as response:
                if 200 <= response.status < 400:
                    on_ready()
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        except Exception:  # http.client oddities from a half-started server: just try again
            pass
        if stop.wait(delay):
            return
        delay = min(delay * 2, 2.0)


@dataclass
class _RoleState:
    role: Role
    state: str = "waiting"  # waiting -> started -> ready
    started_at: float = 0.0
    ready_workers: set[str] = field(default_factory=set)
    watchers: list[tuple[str, LineCallback]] = field(default_factory=list)
    timer: Any = None


class RolesController(Controller):
    """Starts each role once the roles in its `after` are ready; see the module docstring."""

    def __init__(self, plan: RolesPlan) -> None:
        self.plan = plan
        self.states = {r.name: _RoleState(r) for r in plan.roles}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sup: Supervisor | None = None
        self._by_worker = {s.name: r.name for r in plan.roles for s in r.specs}

    def on_start(self, sup: Supervisor) -> None:
        self._sup = sup
        self._start_ready_roles()

    def more_to_start(self) -> bool:
        if self._sup is not None and self._sup.stopping:
            return False
        return any(st.state == "waiting" for st in self.states.values())

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=3.0)

    def _start_ready_roles(self) -> None:
        sup = self._sup
        assert sup is not None
        for st in self.states.values():
            if sup.stopping:
                return
            if st.state != "waiting":
                continue
            if all(self.states[d].state == "ready" for d in st.role.after):
                self._start_role(st)

    def _start_role(self, st: _RoleState) -> None:
        sup = self._sup
        assert sup is not None
        role = st.role
        st.state = "started"
        st.started_at = time.monotonic()
        if role.after:
            sup.message(f"starting role {role.name} ({', '.join(role.after)} ready)")
        for spec in role.specs:
            if role.ready is not None and role.ready.kind == "log":
                callback = self._log_watcher(st, re.compile(role.ready.target))
                sup.start(spec)
                sup.printer.watch(spec.name, callback)
                st.watchers.append((spec.name, callback))
            else:
                sup.start(spec)
        if role.ready is None:
            if role.service:
                self._mark_ready(st, "started")
            return  # a one-shot step: ready when all its workers exited 0 (on_exit)
        check = role.ready
        st.timer = sup.call_later(check.timeout_s, lambda: self._timed_out(st))
        if check.kind == "url":
            thread = threading.Thread(
                target=_poll_url,
                args=(check.target, self._stop, lambda: sup.call_from_thread(lambda: self._mark_ready(st, "answered"))),
                name=f"podguard-ready-{role.name}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def _log_watcher(self, st: _RoleState, pattern: re.Pattern[str]) -> LineCallback:
        def on_line(worker: str, line: str) -> None:
            if st.state == "started" and pattern.search(line):
                st.ready_workers.add(worker)
                if len(st.ready_workers) == len(st.role.specs):
                    self._mark_ready(st, f"printed /{pattern.pattern}/")

        return on_line

    def _mark_ready(self, st: _RoleState, how: str) -> None:
        sup = self._sup
        assert sup is not None
        if st.state != "started":
            return
        st.state = "ready"
        if st.timer is not None:
            st.timer.cancel()
        for worker, callback in st.watchers:
            sup.printer.unwatch(worker, callback)
        st.watchers.clear()
        took = time.monotonic() - st.started_at
        if how == "finished":
            sup.message(f"role {st.role.name} finished ({took:.1f} s)")
        elif how != "started":
            sup.message(f"role {st.role.name} is ready ({how}, {took:.1f} s)")
        self._start_ready_roles()

    def _timed_out(self, st: _RoleState) -> None:
        sup = self._sup
        assert sup is not None
        if st.state != "started" or sup.stopping:
            return
        check = st.role.ready
        assert check is not None
        waiting = [s.name for s in st.role.specs if s.name not in st.ready_workers]
        sup.fail(
            waiting[0] if waiting else st.role.specs[0].name,
            READY_TIMEOUT_EXIT,
            f"role {st.role.name} was not ready after {check.timeout_s:g} s (waiting for {check.describe()})",
        )

    def on_exit(self, sup: Supervisor, worker: Worker) -> None:
        role_name = self._by_worker.get(worker.name)
        if role_name is None:
            return
        st = self.states[role_name]
        if st.state != "started":
            return
        workers = [sup.workers[s.name] for s in st.role.specs if s.name in sup.workers]
        if len(workers) == len(st.role.specs) and all(
            not w.alive and w.popen.returncode == 0 for w in workers
        ):  # a one-shot step (or a role that finished before saying "ready"): it is done
            self._mark_ready(st, "finished")


def run_roles(
    job: str | os.PathLike[str] | RolesPlan,
    selection: Selection,
    *,
    master_port: int | str,
    master_addr: str = DEFAULT_MASTER_ADDR,
    log_dir: Path | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    out: BinaryIO | TextIO | int | None = None,
    only: Collection[str] | None = None,
    tail_lines: int = 20,
    summary: bool = True,
) -> JobOutcome:
    """Run a roles job file (or an already loaded plan) to its end; see the module docstring."""
    plan = (
        job
        if isinstance(job, RolesPlan)
        else load_roles(job, selection, master_port=master_port, master_addr=master_addr, log_dir=log_dir)
    )
    check_specs(plan.specs())
    if only is not None:
        names = {s.name for s in plan.specs()}
        unknown = sorted(set(only) - names)
        if unknown:
            raise UsageError(f"cannot show only {unknown}: no such worker; workers are {', '.join(sorted(names))}")
    sup = Supervisor(grace_s=grace_s, out=out, only=only, tail_lines=tail_lines, summary=summary)
    return sup.run(RolesController(plan))

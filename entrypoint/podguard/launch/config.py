"""How to launch the job: the launcher's options, and the checked plan built from them.

    cfg = configure(["python", "train.py"], LaunchOptions(mode=LaunchMode.PER_GPU), grace_s=7.0)

Every check runs before anything is touched (no kill, no lease): a mistake costs nothing. job/configure.py calls
`configure` among the job's other checks (the job's own options: job/options.py).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from podguard.errors import UsageError
from podguard.launch.prefix import PREFIX_FIELDS, check_format

__all__ = ["DEMO_CPU_WORKERS", "JobConfig", "LaunchMode", "LaunchOptions", "OnExit", "configure", "demo_argv"]

DEMO_CPU_WORKERS = 2


class LaunchMode(StrEnum):
    AUTO = "auto"  # torchrun for a Python training script on >1 GPU, else single
    SINGLE = "single"  # one process sees all selected GPUs
    PER_GPU = "per-gpu"  # one process per GPU
    TORCHRUN = "torchrun"
    ROLES = "roles"  # a --job-file splits the GPUs between roles


class OnExit(StrEnum):
    EXIT = "exit"  # exit with the job's code
    IDLE = "idle"  # keep the container alive after the job
    STOP_POD = "stop-pod"  # stop this RunPod pod through the API


@dataclass(frozen=True)
class LaunchOptions:
    """The launcher's options as the user gave them (parsed, not yet checked against each other)."""

    mode: LaunchMode = LaunchMode.AUTO
    only_gpu: int | None = None
    prefix: str | None = None
    prepare: str | None = None
    cache_key: tuple[str, ...] = ()
    prepare_shared: bool = False
    job_file: Path | None = None
    cpu_workers: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int = 0
    rdzv_backend: str = "auto"  # torchrun: auto (static when NODE_RANK is known), static, c10d


@dataclass(frozen=True)
class JobConfig:
    """A checked launch: what to run, how, and everything derived from the options."""

    argv: tuple[str, ...]
    demo: bool
    mode: LaunchMode
    options: LaunchOptions
    grace_s: float
    prepare_argv: tuple[str, ...] | None = None
    cache_key: dict[str, str] = field(default_factory=dict)

    @property
    def multi_node(self) -> bool:
        return (self.options.nnodes or 1) > 1

    @property
    def job_argv(self) -> list[str]:
        """What identifies the job in outcome records: the command, or the job file in roles mode."""
        return list(self.argv) or [str(self.options.job_file)]


def demo_argv() -> list[str]:
    return [sys.executable, "-m", "podguard.demo"]


def configure(argv: list[str], opts: LaunchOptions, *, grace_s: float, demo: bool = False) -> JobConfig:
    """Check the options against each other and the environment; UsageError (exit 64) on the first problem."""
    mode = _resolve_mode(argv, opts, demo)
    if opts.prefix is not None:
        check_format(opts.prefix, PREFIX_FIELDS, "--prefix")
    prepare_argv, cache_key = _prepare(opts)
    cfg = JobConfig(tuple(argv), demo, mode, opts, grace_s, prepare_argv, cache_key)
    _check_nodes(cfg)
    return cfg


def _resolve_mode(argv: list[str], opts: LaunchOptions, demo: bool) -> LaunchMode:
    mode = opts.mode
    if mode is LaunchMode.ROLES and opts.job_file is None:
        raise UsageError("--mode=roles needs --job-file FILE (a TOML file that splits the GPUs between roles)")
    if opts.job_file is not None:
        if mode not in (LaunchMode.AUTO, LaunchMode.ROLES):
            raise UsageError(f"--job-file is only valid with --mode=roles, not --mode={mode}")
        if not opts.job_file.is_file():
            raise UsageError(f"--job-file={str(opts.job_file)!r} does not exist or is not a file")
        if argv:
            raise UsageError("give either --job-file or a command after `--`, not both")
        return LaunchMode.ROLES
    if not argv and not demo:
        raise UsageError("no command given; put it after `--`, e.g. `podguard run -- python serve.py`")
    return mode


def _prepare(opts: LaunchOptions) -> tuple[tuple[str, ...] | None, dict[str, str]]:
    prepare_argv: tuple[str, ...] | None = None
    if opts.prepare is not None:
        try:
            prepare_argv = tuple(shlex.split(opts.prepare))
        except ValueError as exc:
            raise UsageError(f"--prepare={opts.prepare!r} cannot be parsed: {exc}") from None
        if not prepare_argv:
            raise UsageError("--prepare is empty; give the command that prepares the data")
    cache_key: dict[str, str] = {}
    for item in opts.cache_key:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--cache-key={item!r} is not valid; expected KEY=VALUE, e.g. dataset=gsm8k")
        cache_key[key.strip()] = value
    if cache_key and prepare_argv is None:
        raise UsageError("--cache-key only makes sense with --prepare CMD")
    return prepare_argv, cache_key


def _check_nodes(cfg: JobConfig) -> None:
    opts = cfg.options
    if opts.nnodes is not None and opts.node_rank is not None and opts.node_rank >= opts.nnodes:
        raise UsageError(
            f"NODE_RANK={opts.node_rank} is out of range for NUM_NODES={opts.nnodes}; valid: 0-{opts.nnodes - 1}"
        )
    if cfg.mode is LaunchMode.TORCHRUN or cfg.multi_node:
        from podguard.launch.torchrun.rendezvous import resolve_rendezvous  # noqa: PLC0415  lazy: torchrun or multi-node only (`podguard run` loads no torchrun module)

        resolve_rendezvous(
            os.environ,
            nnodes=opts.nnodes,
            node_rank=opts.node_rank,
            master_addr=opts.master_addr,
            master_port=opts.master_port,
            rdzv_id=None,
        )
    if cfg.multi_node and cfg.mode not in (LaunchMode.TORCHRUN, LaunchMode.AUTO):
        raise UsageError(f"multi-node (NUM_NODES={opts.nnodes}) needs --mode=torchrun, not --mode={cfg.mode}")

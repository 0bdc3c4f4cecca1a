"""How to launch the job: the launch options as typed, and the checked plan built from them.

    cfg = configure(["python", "train.py"], LaunchOptions(mode=LaunchMode.PER_GPU), grace_s=7.0)

Every check runs before anything is touched (no kill, no lease): a mistake costs nothing.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from podguard.errors import UsageError
from podguard.launch.multinode.verdicts import DEFAULT_CLUSTER_TIMEOUT_S
from podguard.store.url import StoreUrl

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
    """The launch options as the user gave them (parsed, not yet checked against each other)."""

    mode: LaunchMode = LaunchMode.AUTO
    only_gpu: int | None = None
    prefix: str | None = None
    on_exit: OnExit = OnExit.EXIT
    rerun: bool = False
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
    # billing guards (guards/): seconds / US dollars, None = off
    idle_stop: float | None = None
    max_runtime: float | None = None
    max_cost: float | None = None
    # during the run (launch/watch/): seconds, a regular expression, relaunches
    hang_timeout: float | None = None
    progress: str | None = None
    restarts: int = 0
    cluster_timeout_s: float = DEFAULT_CLUSTER_TIMEOUT_S  # multi-node: how long the cluster gate waits for all nodes
    cluster_port: int | None = None  # the cluster gate's store port (None: PRIMARY_PORT + 1)
    # metrics (metrics/, docs/metrics.md): the Prometheus endpoint's port, the textfile; None = off
    metrics_port: int | None = None
    metrics_file: Path | None = None
    # checkpoints (checkpoints/, docs/checkpoints.md): the job's folder, the save request before a guard stops it
    checkpoints: Path | None = None
    save_signal: int | None = None  # a signal number
    save_grace: float = 120.0  # seconds
    # the checkpoint store (store/, docs/checkpoints.md "Survive the host"): where whole checkpoints are mirrored
    checkpoint_store: StoreUrl | None = None
    store_keep: int = 2


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
        from podguard.launch.prefix import PREFIX_FIELDS, check_format

        check_format(opts.prefix, PREFIX_FIELDS, "--prefix")
    prepare_argv, cache_key = _prepare(opts)
    _check_checkpoints(opts)
    _check_metrics(opts)
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


def _check_checkpoints(opts: LaunchOptions) -> None:
    if opts.checkpoints is not None and os.path.exists(opts.checkpoints) and not os.path.isdir(opts.checkpoints):
        raise UsageError(f"--checkpoints={str(opts.checkpoints)!r} is not a folder; give the folder the job saves to")
    if opts.save_signal is not None and opts.checkpoints is None:
        raise UsageError(
            "--save-signal needs --checkpoints DIR: podguard waits for the new checkpoint there before it ends the job"
        )
    if opts.checkpoint_store is not None and opts.checkpoints is None:
        raise UsageError(
            f"--checkpoint-store={opts.checkpoint_store} needs --checkpoints DIR: podguard mirrors the checkpoints "
            "the job writes there"
        )


def _check_metrics(opts: LaunchOptions) -> None:
    """The metrics are bound before the launch: on the rendezvous port (`run` hands the job MASTER_PORT) the job's
    rendezvous would find it taken."""
    rendezvous = {str(opts.master_port), os.environ.get("MASTER_PORT", "").strip()}
    if opts.metrics_port is not None and str(opts.metrics_port) in rendezvous:
        raise UsageError(
            f"--metrics-port={opts.metrics_port} is also the rendezvous port (--master-port or MASTER_PORT); give "
            "the metrics a port of their own, e.g. 9464"
        )


def _check_nodes(cfg: JobConfig) -> None:
    opts = cfg.options
    if opts.nnodes is not None and opts.node_rank is not None and opts.node_rank >= opts.nnodes:
        raise UsageError(
            f"NODE_RANK={opts.node_rank} is out of range for NUM_NODES={opts.nnodes}; valid: 0-{opts.nnodes - 1}"
        )
    if cfg.mode is LaunchMode.TORCHRUN or cfg.multi_node:
        from podguard.launch.torchrun.command import resolve_rendezvous

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

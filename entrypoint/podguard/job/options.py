"""The options of `podguard train|run` as typed, and the job's settings as checked: one part per room.

    options = JobOptions(mode=LaunchMode.PER_GPU, idle_stop=600.0, checkpoints=Path("/workspace/ckpt"))
    settings = configure(argv, options, preflight_opts)      # job/configure.py: every check, then JobSettings
    settings.launch.options   # LaunchOptions: what the launcher needs (launch/config.py)
    settings.guards           # GuardSettings (guards/), settings.metrics, settings.checkpoints, settings.gate ...

`JobOptions` is what the CLI's option table fills (cli/options.py), flat, as the user gave it; `configure()` checks
it and splits it into `JobSettings`, where each room finds its own typed part and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.launch.config import JobConfig, LaunchOptions, OnExit
from podguard.launch.multinode.verdicts import DEFAULT_CLUSTER_TIMEOUT_S
from podguard.store.url import StoreUrl

if TYPE_CHECKING:
    from podguard.guards.settings import GuardSettings
    from podguard.launch.multinode.verdicts import GateSettings
    from podguard.pods.selfheal import SelfHealConfig

__all__ = ["CheckpointSettings", "JobOptions", "JobSettings", "MetricsSettings"]


@dataclass(frozen=True)
class JobOptions(LaunchOptions):
    """The options of `train`/`run` as the user gave them (parsed, not yet checked against each other): the
    launcher's (LaunchOptions, launch/config.py) and every other room's."""

    # the job's lifecycle (job/): after the job, a finished job's rerun, relaunches
    on_exit: OnExit = OnExit.EXIT
    rerun: bool = False
    restarts: int = 0
    # billing guards (guards/): seconds / US dollars, None = off
    idle_stop: float | None = None
    max_runtime: float | None = None
    max_cost: float | None = None
    # during the run (launch/watch/): seconds, a regular expression
    hang_timeout: float | None = None
    progress: str | None = None
    # multi-node: how long the cluster gate waits for all nodes, its store's port (None: PRIMARY_PORT + 1)
    cluster_timeout_s: float = DEFAULT_CLUSTER_TIMEOUT_S
    cluster_port: int | None = None
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

    def launch(self) -> LaunchOptions:
        """The launcher's part."""
        return LaunchOptions(**{f.name: getattr(self, f.name) for f in fields(LaunchOptions)})


@dataclass(frozen=True)
class MetricsSettings:
    """`--metrics-port`, `--metrics-file` and PODGUARD_METRICS_INTERVAL (None: the file's default)."""

    port: int | None
    path: Path | None
    every_s: float | None = None


@dataclass(frozen=True)
class CheckpointSettings:
    """`--checkpoints` (the job's folder), `--save-signal`/`--save-grace`, `--checkpoint-store`/`--store-keep`."""

    folder: Path
    save_signal: int | None = None
    save_grace_s: float = 120.0
    store: StoreUrl | None = None
    store_keep: int = 2


@dataclass(frozen=True)
class JobSettings:
    """A `train`/`run` as checked (job/configure.py): each room's part, typed."""

    launch: JobConfig  # what to run and how: the launcher's options, the mode, the prepare step
    on_exit: OnExit = OnExit.EXIT
    rerun: bool = False  # run a job that finished before on this pod again
    restarts: int = 0  # --restarts: relaunches of this node's job
    hang_timeout_s: float | None = None  # the run-time watch (launch/watch/): None = no hang detection
    progress: str | None = None  # what counts as progress (a regular expression; None: any line)
    guards: GuardSettings | None = None  # --idle-stop, --max-runtime, --max-cost (None: no guard)
    metrics: MetricsSettings | None = None  # None: neither --metrics-port nor --metrics-file
    checkpoints: CheckpointSettings | None = None  # None: no --checkpoints
    self_heal: SelfHealConfig | None = None  # None: none of its variables is set
    gate: GateSettings | None = None  # the cluster gate on a multi-node run (None: one node, or no NODE_RANK)

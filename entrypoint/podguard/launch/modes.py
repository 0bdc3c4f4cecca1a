"""Launch modes: turn the preflight's `Selection` and the user's command into `WorkerSpec`s.

    specs = per_gpu_specs(["python", "train.py"], selection, master_port=29500, log_dir=logs)
    choice = pick_mode(argv, selection)       # auto: ModeChoice(LaunchMode.TORCHRUN, "mode auto -> ...")

single: one process sees exactly the selected GPUs (by UUID). per-gpu: one process per selected GPU with
torch's `env://` variables set, output prefixed `GPU{index}:`, one log file each (`nproc` CPU workers on a
node without GPUs). roles: `podguard.launch.roles`. torchrun: `podguard.launch.torchrun`. The defaults every
worker gets (PYTHONUNBUFFERED, line-buffered C stdio, rich's TTY_* switches, OMP_NUM_THREADS) and why:
docs/supervisor.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.errors import UsageError
from podguard.launch.config import LaunchMode
from podguard.launch.job_env import job_env, line_buffering_env, progress_bar_env
from podguard.launch.ports import parse_port
from podguard.launch.prefix import DEFAULT_CPU_PREFIX, DEFAULT_PREFIX, PREFIX_FIELDS, check_format
from podguard.launch.spec import WorkerSpec

if TYPE_CHECKING:
    from podguard.gpu.selected import SelectedGpu, Selection

__all__ = [
    "DEFAULT_MASTER_ADDR",
    "MODES",
    "PREFIX_FIELDS",
    "SINGLE_NAME",
    "ModeChoice",
    "check_format",
    "gpu_labels",
    "is_python_training_command",
    "job_env",
    "line_buffering_env",
    "log_path",
    "only_for_gpu",
    "per_gpu_specs",
    "pick_mode",
    "progress_bar_env",
    "single_spec",
    "validate_mode",
    "visible_env",
]

MODES = tuple(m.value for m in LaunchMode)
DEFAULT_MASTER_ADDR = "127.0.0.1"
SINGLE_NAME = "job"

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
_LAUNCHERS = {"torchrun", "accelerate", "deepspeed", "mpirun", "srun", "colossalai"}
_LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch"}


# --------------------------------------------------------------------------------------------------
# Shared helpers (the roles job file builds its workers with them too)


def validate_mode(mode: str) -> LaunchMode:
    try:
        return LaunchMode(mode)
    except ValueError:
        raise UsageError(f"mode {mode!r} is not valid; choose one of: {', '.join(MODES)}") from None


def gpu_labels(gpus: Sequence[SelectedGpu]) -> list[str]:
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


def log_path(log_dir: Path | None, name: str) -> Path | None:
    return Path(log_dir) / f"{name}.log" if log_dir is not None else None


def visible_env(gpus: Sequence[SelectedGpu]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES (by UUID, in PCI bus order) for a process that sees exactly `gpus`."""
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
    child = {**job_env(1), **selection.child_env(), **(env or {})}
    gpus = ",".join(gpu_labels(selection.gpus)) or "none"
    return WorkerSpec(
        name=SINGLE_NAME,
        argv=tuple(argv),
        env=child,
        prefix=prefix,
        log_path=log_path(log_dir, SINGLE_NAME),
        cwd=cwd,
        label=f"the job (GPUs {gpus})" if selection.gpus else "the job (CPU only)",
        gpus=tuple(selection.indices),
    )


def _worker_labels(selection: Selection, nproc: int | None) -> list[str]:
    """One label per per-gpu worker: the GPU labels, or `nproc` (default 1) times "cpu" without GPUs."""
    if not selection.cpu_only:
        return gpu_labels(selection.gpus)
    count = 1 if nproc is None else nproc
    if count < 1:
        raise UsageError(f"nproc={nproc} is not valid; expected at least 1 CPU worker")
    return ["cpu"] * count


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
    """One worker per selected GPU (or `nproc` CPU workers on a CPU-only node), with torch's env:// set.

    Ranks: RANK = node_rank * workers + local rank, WORLD_SIZE = nnodes * workers (every node must run
    the same number of workers, as with torchrun's `--nproc-per-node`).
    """
    if not argv:
        raise UsageError("per-gpu mode needs a command, e.g. `podguard train --mode per-gpu -- python train.py`")
    port = parse_port(master_port, "MASTER_PORT")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"node rank {node_rank} of {nnodes} node(s) is not valid; expected 0 <= node rank < nodes")
    cpu = selection.cpu_only
    labels = _worker_labels(selection, nproc)
    count = len(labels)
    fmt = prefix_format if prefix_format is not None else (DEFAULT_CPU_PREFIX if cpu else DEFAULT_PREFIX)
    check_format(fmt, PREFIX_FIELDS, "prefix format")
    common = {
        **job_env(count),
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
                log_path=log_path(log_dir, name),
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
    mode: LaunchMode  # SINGLE or TORCHRUN
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
        return ModeChoice(LaunchMode.SINGLE, f"mode auto -> single: {where}, so the command runs once as is")
    if script:
        return ModeChoice(
            LaunchMode.TORCHRUN,
            f"mode auto -> torchrun: {n} GPUs are selected and the command is {what}; one rank per GPU",
        )
    return ModeChoice(
        LaunchMode.SINGLE,
        f"mode auto -> single: {what}, so it runs once and sees all {n} GPUs (use --mode per-gpu to split)",
    )

"""Sweeps: N independent runs of K GPUs each on one host, each a separate `podguard train`.

    plan = plan_sweep(8, 2)                          # run0=[0,1] run1=[2,3] run2=[4,5] run3=[6,7]
    result = run_sweep(plan, ["python", "train.py"])  # output prefixed run0: run1: ...

Each run gets `GPU_LIST` (so it does its own preflight, GPU lease and MASTER_PORT lease) and is supervised
like a job's worker, except that one failing does not stop the others. The sweep's exit code is that of
the first run to fail, in time; a signal to the sweep is forwarded to every run and ends it with 128+N.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec

# Variables that would contradict the run's own GPU set or port: the plan and the leases decide them.
STRIPPED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "PODGUARD_GPU_LIST",
    "PODGUARD_CUDA_VISIBLE_DEVICES",
    "NPROC_PER_NODE",
    "PODGUARD_NPROC_PER_NODE",
    "MASTER_PORT",
    "PODGUARD_MASTER_PORT",
    "PODGUARD_METRICS_PORT",  # one endpoint per port: N runs on one port would be 64 for all but the first
    "PODGUARD_METRICS_FILE",  # ... and N runs would overwrite one textfile
)
DEFAULT_PREFIX = "run{i}:"
DEFAULT_SWEEP_GRACE_S = 10.0  # each run is a podguard with its own 7 s grace: give it time to use it


@dataclass(frozen=True)
class SweepRun:
    index: int  # 0-based, like GPU and rank numbers
    gpus: tuple[str, ...]  # GPU indices or UUIDs, as GPU_LIST takes them

    @property
    def gpu_list(self) -> str:
        return ",".join(self.gpus)


@dataclass(frozen=True)
class SweepPlan:
    runs: tuple[SweepRun, ...]
    gpus_per_run: int
    total_gpus: int
    unused: tuple[str, ...] = ()  # GPUs no run gets (total not a multiple of gpus_per_run, or fewer runs)

    def describe(self) -> str:
        text = f"{len(self.runs)} runs × {self.gpus_per_run} GPUs: " + "  ".join(
            f"run{r.index}=[{r.gpu_list}]" for r in self.runs
        )
        if self.unused:
            text += f"  (unused: {','.join(self.unused)})"
        return text


def _count(raw: int | str, name: str, *, minimum: int) -> int:
    if isinstance(raw, bool):
        raise UsageError(f"{name}={raw!r} is not a whole number; expected an integer >= {minimum}")
    if isinstance(raw, str):
        if not re.fullmatch(r"\s*\d+\s*", raw):
            raise UsageError(f"{name}={raw!r} is not a whole number; expected an integer >= {minimum}")
        raw = int(raw)
    if raw < minimum:
        raise UsageError(f"{name}={raw} is invalid; expected an integer >= {minimum}")
    return raw


def plan_sweep(
    total_gpus: int | Sequence[int | str],
    gpus_per_run: int | str,
    runs: int | str | None = None,
) -> SweepPlan:
    """Split the node's GPUs into `runs` disjoint sets of `gpus_per_run`, in order.

    total_gpus: a count (GPUs 0..N-1) or the GPU ids to use (e.g. the selection's indices or UUIDs).
    runs=None: as many runs as fit. Bad numbers exit 64; asking for more GPUs than the node has exits
    69 ("4 runs × 2 GPUs = 8 > 6 GPUs on this node"), as for any required GPUs that are not there.
    """
    if isinstance(total_gpus, (int, str)) and not isinstance(total_gpus, bool):
        n = _count(total_gpus, "total GPUs", minimum=0)
        ids: tuple[str, ...] = tuple(str(i) for i in range(n))
    else:
        ids = tuple(str(g).strip() for g in total_gpus)
        if any(not g for g in ids):
            raise UsageError(f"GPU list {list(total_gpus)!r} has an empty entry; expected indices or UUIDs")
        dupes = sorted({g for g in ids if ids.count(g) > 1})
        if dupes:
            raise UsageError(f"GPU {', '.join(dupes)} is listed twice; each GPU can go to one run only")
    per = _count(gpus_per_run, "GPUs per run", minimum=1)
    total = len(ids)
    where = f"{total} GPU{'s' if total != 1 else ''} on this node"
    if runs is None:
        if per > total:
            raise PodguardError(f"{per} GPUs per run > {where}", ExitCode.GPUS_MISSING)
        count = total // per
    else:
        count = _count(runs, "runs", minimum=1)
        if count * per > total:
            raise PodguardError(
                f"{count} run{'s' if count != 1 else ''} × {per} GPU{'s' if per != 1 else ''} = "
                f"{count * per} > {where}",
                ExitCode.GPUS_MISSING,
            )
    plan_runs = tuple(SweepRun(i, ids[i * per : (i + 1) * per]) for i in range(count))
    return SweepPlan(plan_runs, per, total, ids[count * per :])


# --------------------------------------------------------------------------------------------------
# Running a sweep


@dataclass(frozen=True)
class SweepRunResult:
    index: int
    gpu_list: str
    argv: tuple[str, ...]
    pid: int
    exit_code: int  # shell style: the status, or 128+N when killed by signal N
    duration_s: float
    log_path: Path | None = None


@dataclass(frozen=True)
class SweepResult:
    runs: tuple[SweepRunResult, ...]
    exit_code: int  # 0, the first failed run's code, or 128+N when the sweep got signal N
    first_failure: int | None = None  # index of the run that failed first
    signal: int | None = None


ArgvBuilder = Callable[[SweepRun], Sequence[str]]


def podguard_train_argv(command: Sequence[str] = (), train_args: Sequence[str] = ()) -> ArgvBuilder:
    """The default argv builder: `python -m podguard train [train_args] [-- command]`."""

    def build(run: SweepRun) -> list[str]:
        argv = [sys.executable, "-m", "podguard", "train", *train_args]
        if command:
            argv += ["--", *command]
        return argv

    return build


def sweep_env(run: SweepRun, runs: int, base: Mapping[str, str], name: str | None = None) -> dict[str, str]:
    """A run's environment: GPU_LIST = its GPUs; GPU-set and port overrides removed (see STRIPPED_ENV);
    PODGUARD_SWEEP_INDEX / _SIZE / _NAME so the training script can pick its hyperparameters."""
    env = {k: v for k, v in base.items() if k not in STRIPPED_ENV}
    env["GPU_LIST"] = run.gpu_list
    env["PODGUARD_SWEEP_INDEX"] = str(run.index)
    env["PODGUARD_SWEEP_SIZE"] = str(runs)
    if name:
        env["PODGUARD_SWEEP_NAME"] = f"{name}.run{run.index}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _specs(
    plan: SweepPlan, build: ArgvBuilder, base_env: Mapping[str, str], name: str | None, prefix: str,
    log_dir: Path | None,
) -> list[WorkerSpec]:  # fmt: skip
    """One worker per run: its argv, its whole environment, `run{i}:` lines, `run{i}.log`."""
    return [
        WorkerSpec(
            name=f"run{run.index}",
            argv=tuple(str(a) for a in build(run)),
            env=sweep_env(run, len(plan.runs), base_env, name),
            inherit_env=False,
            prefix=prefix.format(i=run.index),
            log_path=Path(log_dir) / f"run{run.index}.log" if log_dir is not None else None,
            label=f"run{run.index} (GPUs {run.gpu_list})",
        )
        for run in plan.runs
    ]


def run_sweep(
    plan: SweepPlan,
    command: Sequence[str] = (),
    *,
    train_args: Sequence[str] = (),
    argv_builder: ArgvBuilder | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    output: BinaryIO | None = None,
    prefix: str = DEFAULT_PREFIX,
    log_dir: Path | None = None,
    grace_s: float = DEFAULT_SWEEP_GRACE_S,
) -> SweepResult:
    """Start every run of `plan` at once and wait for all of them (main thread only: signals).

    Each run is `argv_builder(run)` (default: `podguard train [train_args] -- command`) with `sweep_env(...)`
    as its whole environment; its output goes to `output` (default stdout) as whole lines prefixed
    `prefix.format(i=index)`, and unprefixed to `log_dir/run{i}.log` when given. The runs are supervised
    like the workers of a job, except that one failing does not stop the others.
    """
    if not plan.runs:
        raise UsageError("the sweep plan has no runs")
    try:
        prefix.format(i=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"run prefix {prefix!r} is invalid ({exc}); it may use {{i}}") from None
    build = argv_builder or podguard_train_argv(command, train_args)
    specs = _specs(plan, build, dict(os.environ if env is None else env), name, prefix, log_dir)
    try:
        outcome = run_job(specs, grace_s=grace_s, terminal=output, summary=False, fail_fast=False)
    except UsageError as exc:
        raise UsageError(f"cannot start the sweep: {exc.message}") from None
    runs = tuple(
        SweepRunResult(
            index=run.index,
            gpu_list=run.gpu_list,
            argv=spec.argv,
            pid=exit.pid,
            exit_code=exit.exit_code,
            duration_s=exit.duration_s or 0.0,
            log_path=spec.log_path,
        )
        for run, spec, exit in zip(plan.runs, specs, outcome.workers, strict=True)
    )
    root = outcome.root_cause
    first = next((r.index for r, s in zip(runs, specs, strict=True) if root is not None and s.name == root.name), None)
    return SweepResult(runs, outcome.exit_code, first, outcome.signal)

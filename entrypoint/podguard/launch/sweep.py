"""Sweeps: N independent runs of K GPUs each on one host (the seed's `sweep_multi_gpu.sh my_sweep 2 4`).

The seed's script hand-assigned `gpu_list=0,1` / `2,3` / ... and gave every run the same MASTER_PORT.
Here the plan splits the node's GPUs into disjoint sets, each run is a separate `podguard train` with
`GPU_LIST` set to its set (so it does its own preflight and holds its own GPU lease, and its own port
lease picks a distinct MASTER_PORT), and the runs' output is multiplexed with a `run{i}:` prefix.

Runs are independent: one failing does not stop the others (unlike workers of one job, which fail
fast). The sweep's exit code is that of the first run to fail, in time; a signal to the sweep is
forwarded to every run and ends it with 128+N.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from podguard.errors import ExitCode, PodguardError, UsageError, signal_exit_code

# Variables that would contradict the run's own GPU set or port: the plan and the leases decide them.
STRIPPED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "PODGUARD_GPU_LIST",
    "PODGUARD_CUDA_VISIBLE_DEVICES",
    "NPROC_PER_NODE",
    "PODGUARD_NPROC_PER_NODE",
    "MASTER_PORT",
    "PODGUARD_MASTER_PORT",
)
DEFAULT_PREFIX = "run{i}:"
_MAX_LINE = 1 << 20


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


class _Child:
    def __init__(self, run: SweepRun, argv: list[str], proc: subprocess.Popen[bytes], prefix: bytes, log) -> None:
        self.run, self.argv, self.proc, self.prefix, self.log = run, argv, proc, prefix, log
        self.partial = b""
        self.open = True
        self.started = time.monotonic()
        self.ended: float | None = None
        self.code: int | None = None


def _shell_code(status: int) -> int:
    return signal_exit_code(-status) if status < 0 else status


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
    grace_s: float = 10.0,
    forward_signals: bool = True,
) -> SweepResult:
    """Start every run of `plan` at once and wait for all of them.

    Each run is `argv_builder(run)` (default: `podguard train [train_args] -- command`) with
    `sweep_env(...)`; its stdout+stderr (one pipe per run, so lines never mix) goes to `output` as whole
    lines prefixed `prefix.format(i=index)`, and unprefixed to `log_dir/run{i}.log` when given.
    Runs start in their own sessions: SIGTERM/SIGINT/SIGHUP to the sweep (main thread only) are
    forwarded once to every run; runs still alive `grace_s` later are killed with their process group.
    """
    if not plan.runs:
        raise UsageError("the sweep plan has no runs")
    try:
        prefix.format(i=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"run prefix {prefix!r} is invalid ({exc}); it may use {{i}}") from None
    build = argv_builder or podguard_train_argv(command, train_args)
    base_env = dict(os.environ if env is None else env)
    out = output if output is not None else sys.stdout.buffer
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)

    got_signal: list[int] = []
    kill_at: list[float] = []
    children: list[_Child] = []

    def on_signal(signum: int, frame: object) -> None:
        if not got_signal:
            got_signal.append(signum)
            kill_at.append(time.monotonic() + grace_s)
        for c in children:
            if c.code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.proc.pid, signum)

    previous: dict[int, object] = {}
    if forward_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[sig] = signal.signal(sig, on_signal)

    sel = selectors.DefaultSelector()
    try:
        for run in plan.runs:
            argv = [str(a) for a in build(run)]
            log = open(Path(log_dir) / f"run{run.index}.log", "ab") if log_dir is not None else None  # noqa: SIM115
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=sweep_env(run, len(plan.runs), base_env, name),
                    start_new_session=True,
                )
            except OSError as exc:
                if log is not None:
                    log.close()
                raise UsageError(f"cannot start sweep run {run.index} ({argv[0]!r}): {exc.strerror}") from None
            child = _Child(run, argv, proc, prefix.format(i=run.index).encode(), log)
            children.append(child)
            assert proc.stdout is not None
            sel.register(proc.stdout.fileno(), selectors.EVENT_READ, child)
        finish_order = _pump(children, sel, out, kill_at)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        for c in children:  # only reached with live runs when something went wrong above
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
            if c.proc.stdout is not None:
                c.proc.stdout.close()
            if c.log is not None:
                c.log.close()
        sel.close()

    results = tuple(
        SweepRunResult(
            index=c.run.index,
            gpu_list=c.run.gpu_list,
            argv=tuple(c.argv),
            pid=c.proc.pid,
            exit_code=c.code if c.code is not None else _shell_code(c.proc.returncode),
            duration_s=(c.ended or time.monotonic()) - c.started,
            log_path=Path(log_dir) / f"run{c.run.index}.log" if log_dir is not None else None,
        )
        for c in children
    )
    first = next((c.run.index for c in finish_order if c.code), None)
    if got_signal:
        return SweepResult(results, signal_exit_code(got_signal[0]), first, got_signal[0])
    code = next((c.code for c in finish_order if c.code), 0) or 0
    return SweepResult(results, code, first)


def _pump(children: list[_Child], sel: selectors.BaseSelector, out: BinaryIO, kill_at: list[float]) -> list[_Child]:
    """Multiplex the runs' output until every run has exited; the runs in the order they ended."""
    finished: list[_Child] = []
    drain_until: dict[int, float] = {}
    while len(finished) < len(children):
        for key, _ in sel.select(0.1):
            child: _Child = key.data
            data = os.read(key.fd, 65536)
            if data:
                _emit(child, data, out, final=False)
            else:
                _close_stream(child, sel, out)
        now = time.monotonic()
        for c in children:
            if c.code is None and c.proc.poll() is not None:
                c.code = _shell_code(c.proc.returncode)
                c.ended = now
                finished.append(c)
                drain_until[id(c)] = now + 1.0
            elif c.code is not None and c.open and now >= drain_until.get(id(c), now):
                _close_stream(c, sel, out)  # a leftover grandchild holds the pipe open: stop reading it
        if kill_at and now >= kill_at[0]:
            for c in children:
                if c.code is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(c.proc.pid, signal.SIGKILL)
    # what is still buffered in the pipes of runs whose stream has not reached EOF yet
    for c in children:
        if c.open and c.proc.stdout is not None:
            fd = c.proc.stdout.fileno()
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError, OSError):
                while data := os.read(fd, 65536):
                    _emit(c, data, out, final=False)
            _close_stream(c, sel, out)
    return finished


def _close_stream(child: _Child, sel: selectors.BaseSelector, out: BinaryIO) -> None:
    if not child.open:
        return
    child.open = False
    _emit(child, b"", out, final=True)
    assert child.proc.stdout is not None
    with contextlib.suppress(KeyError, ValueError):
        sel.unregister(child.proc.stdout.fileno())


def _emit(child: _Child, data: bytes, out: BinaryIO, *, final: bool) -> None:
    """Write the whole lines in `data` (plus a partial line at the end of the stream), prefixed."""
    buf = child.partial + data
    if final:
        lines, child.partial = (buf.split(b"\n") if buf else []), b""
        if lines and lines[-1] == b"":
            lines.pop()
    else:
        *lines, child.partial = buf.split(b"\n")
        if len(child.partial) > _MAX_LINE:  # never hold an endless line in memory: pass it on as is
            lines.append(child.partial)
            child.partial = b""
    if not lines:
        return
    if child.log is not None:
        child.log.write(b"".join(line + b"\n" for line in lines))
    chunk = b"".join(child.prefix + line + b"\n" for line in lines)
    with contextlib.suppress(OSError, ValueError):
        out.write(chunk)
        out.flush()

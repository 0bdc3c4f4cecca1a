"""Every worker's Python stacks (all threads), taken from outside when a job is hung; the per-rank summary.

    targets = find_rank_processes({"torchrun": agent_pid}, gpus={"torchrun": (0, 1)})
    stacks = capture_stacks(targets, state_dir / "stacks")      # never raises, parallel, bounded
    for line in hang_summary(stacks):                           # "rank 1 (GPU 1): data.py:12 in load_batch"
        print(line)

The mechanism is `py-spy dump` (PyPI `py-spy`, a static binary: podguard's `stacks` extra): it reads the
interpreter's memory with process_vm_readv and pauses the process with ptrace for a consistent snapshot, so
the user's code needs no change. It needs ptrace permission over the workers: CAP_SYS_PTRACE
(`--cap-add SYS_PTRACE`), or no Yama restriction (`kernel.yama.ptrace_scope` 0), or a worker that allowed
podguard as its tracer (`allow_tracing_by`, Yama scope 1). Where it cannot work, each rank's `error` says
why in one line, with the fix. Why this choice and the alternatives: docs/watch.md, "Stacks".
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from podguard.launch.orphans import release_helper, start_helper
from podguard.launch.watch.ranks import StackTarget, find_rank_processes
from podguard.launch.watch.stack_model import Frame, RankStacks, ThreadStack
from podguard.launch.watch.verdict import COLLECTIVES, collective_of, hang_summary
from podguard.procfs import PROC, read_stat

__all__ = [
    "COLLECTIVES",
    "PY_SPY_INSTALL",
    "Frame",
    "RankStacks",
    "StackTarget",
    "ThreadStack",
    "allow_tracing_by",
    "capture_ranks",
    "capture_stacks",
    "find_py_spy",
    "find_rank_processes",
    "hang_summary",
    "ptrace_diagnosis",
    "settle_roles",
]

PY_SPY_INSTALL = "pip install 'podguard[stacks]' (or: pip install py-spy)"
PR_SET_PTRACER = 0x59616D61  # Yama: "this process may be traced by <pid> and its descendants"
CAP_SYS_PTRACE = 19
KILL_WAIT_S = 2.0  # after SIGKILL to a py-spy that did not answer: how long to wait for it to go


def allow_tracing_by(pid: int) -> bool:
    """Let `pid` and its descendants (py-spy started by podguard) trace the calling process under Yama's
    ptrace_scope 1, which otherwise allows only ancestors. Call it in a worker between fork and exec (it
    survives exec: Yama keeps the relation until the process ends). False where the kernel has no Yama."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# --------------------------------------------------------------------------------------------------
# capture


def find_py_spy() -> str | None:
    """PODGUARD_PY_SPY where set, else py-spy next to this Python (a virtualenv not on PATH), else on PATH."""
    if chosen := os.environ.get("PODGUARD_PY_SPY"):
        return chosen
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _status_field(name: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(f"{PROC}/self/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return line.split(":", 1)[1].strip()
    return None


def _yama_scope() -> int | None:
    try:
        return int(Path(f"{PROC}/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def ptrace_diagnosis() -> str:
    """Why ptrace was refused here, and the fix, in one line (read from Yama, capabilities, seccomp)."""
    scope = _yama_scope()
    caps = int(_status_field("CapEff") or "0", 16)
    has_cap = bool(caps >> CAP_SYS_PTRACE & 1)
    seccomp = _status_field("Seccomp") == "2"
    if scope == 3:
        return "ptrace is disabled on this host (kernel.yama.ptrace_scope=3): stacks cannot be taken from outside"
    if not has_cap and scope in (1, 2):
        return (
            f"ptrace not allowed: the host restricts it (kernel.yama.ptrace_scope={scope}) and the container "
            "lacks CAP_SYS_PTRACE; start it with --cap-add SYS_PTRACE"
        )
    if has_cap and seccomp:
        return (
            "ptrace not allowed by the container's seccomp profile (Docker < 19.03 or a kernel < 4.8); "
            "start it with --cap-add SYS_PTRACE or --security-opt seccomp=unconfined"
        )
    return "ptrace not allowed (permission denied); start the container with --cap-add SYS_PTRACE"


def _explain(stderr: str) -> str:
    """py-spy's failure as one line with its cause and fix."""
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text or "os error 1)" in text:
        return ptrace_diagnosis()
    if "no such file" in text or "no such process" in text or "os error 3)" in text:
        return "the process had already exited"
    if "python version" in text or "python interpreter" in text:
        return "not a Python process (py-spy found no interpreter in it)"
    first = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "no output")
    return f"py-spy failed: {first.removeprefix('Error: ')[:200]}"


def _stem(target: StackTarget) -> str:
    if target.rank is not None:
        return f"rank{target.rank}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", target.name) + f"-{target.pid}"


@dataclass
class _Run:
    target: StackTarget
    raw: Path
    err: Path
    popen: subprocess.Popen[bytes] | None
    started: float
    stopped_before: bool
    error: str | None = None
    ended: float | None = None


def _start(target: StackTarget, py_spy: Sequence[str], out_dir: Path) -> _Run:
    stem = _stem(target)
    raw, err = out_dir / f"{stem}.json", out_dir / f".{stem}.err"
    stat = read_stat(target.pid)
    run = _Run(target, raw, err, None, time.monotonic(), stat is not None and stat.state in ("T", "t"))
    if stat is None or stat.state in ("Z", "X"):
        run.error = "the process had already exited"
        return run
    argv = [*py_spy, "dump", "--pid", str(target.pid), "--json"]  # JSON has full and short file names
    if run.stopped_before:  # ptrace cannot pause a process that is stopped already: read its memory as it is
        argv.append("--nonblocking")
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    try:
        with raw.open("wb") as out, err.open("wb") as errf:
            run.popen = start_helper(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=errf, env=env)
    except OSError as exc:
        run.error = f"cannot run py-spy: {exc.strerror or exc}"
    return run


def _finish(run: _Run, deadline: float, timeout_s: float) -> None:
    if run.popen is not None:
        try:
            run.popen.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            run.popen.kill()
            run.error = f"py-spy did not answer within {timeout_s:g} s (the process may be in uninterruptible I/O)"
            try:  # bounded: a py-spy blocked in the kernel (D state) outlives SIGKILL; it is given up, not waited for
                run.popen.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                run.error += f"; py-spy itself could not be ended (pid {run.popen.pid}, blocked in the kernel)"
        release_helper(run.popen)  # (one given up on is the orphan reaper's to reap once the kernel lets it go)
    run.ended = time.monotonic()
    _resume_if_stopped(run)


def _resume_if_stopped(run: _Run) -> None:
    """Never leave a process stopped: one that py-spy left in a stop (and was not stopped before) continues."""
    stat = read_stat(run.target.pid)
    if stat is not None and stat.state in ("T", "t") and not run.stopped_before:
        with contextlib.suppress(OSError):
            os.kill(run.target.pid, signal.SIGCONT)


def _frames(items: list[dict[str, object]]) -> tuple[Frame, ...]:
    out = []
    for f in items:
        line = f.get("line")
        out.append(
            Frame(
                function=str(f.get("name") or "?"),
                file=str(f.get("filename") or "?"),
                line=line if isinstance(line, int) else 0,
                short_file=str(f.get("short_filename") or ""),
            )
        )
    return tuple(out)


def _parse(data: object) -> tuple[ThreadStack, ...]:
    """py-spy's --json dump: a list of threads, each with frames innermost first."""
    threads = []
    for t in data if isinstance(data, list) else []:
        if not isinstance(t, dict):
            continue
        tid = t.get("os_thread_id") or t.get("thread_id") or 0
        frames = t.get("frames") if isinstance(t.get("frames"), list) else []
        threads.append(
            ThreadStack(
                thread_id=int(tid) if isinstance(tid, int) else 0,
                name=str(t["thread_name"]) if t.get("thread_name") else None,
                active=bool(t.get("active")),
                frames=_frames([f for f in frames if isinstance(f, dict)]),  # type: ignore[union-attr]
            )
        )
    return tuple(threads)


def _main_thread(target: StackTarget, threads: Sequence[ThreadStack]) -> ThreadStack | None:
    main = next((t for t in threads if t.thread_id == target.pid), None)
    return main or next((t for t in threads if any(f.is_user for f in t.frames)), None)


def _where(target: StackTarget, threads: Sequence[ThreadStack]) -> tuple[str | None, str | None]:
    main = _main_thread(target, threads)
    if main is None:
        return None, None
    index = next((i for i, f in enumerate(main.frames) if f.is_user), None)
    user = main.frames[index].where() if index is not None else None
    return user, collective_of(main.frames, index, line_of=_source_line)


def _source_line(frame: Frame) -> str:
    """The frame's source line, read from its file as podguard sees it (the same container): '' when unreadable."""
    linecache.checkcache(frame.file)
    return linecache.getline(frame.file, frame.line)


def render(target: StackTarget, threads: Sequence[ThreadStack]) -> str:
    """The kept text: py-spy's own layout, full file names, one block per thread."""
    lines = [f"{target.label}: pid {target.pid}, worker {target.name} (py-spy dump, innermost frame first)"]
    for t in threads:
        state = "active" if t.active else "idle"
        lines.append(f'Thread {t.thread_id} ({state}): "{t.name or ""}"')
        lines.extend(f"    {f.function} ({f.file}:{f.line})" for f in t.frames)
    return "\n".join(lines) + "\n"


def _result(run: _Run) -> RankStacks:
    duration = ((run.ended or time.monotonic()) - run.started) * 1000
    error = run.error
    threads: tuple[ThreadStack, ...] = ()
    if error is None and run.popen is not None and run.popen.returncode != 0:
        error = _explain(_read(run.err))
    if error is None:
        try:
            threads = _parse(json.loads(_read(run.raw) or "null"))
        except ValueError:
            error = "py-spy's output could not be read"
    with contextlib.suppress(OSError):
        run.err.unlink()
    if error is not None or not threads:
        with contextlib.suppress(OSError):
            run.raw.unlink()
        error = error or "py-spy found no Python threads"
        return RankStacks(run.target, None, (), None, error, duration, stopped=run.stopped_before)
    threads = tuple(sorted(threads, key=lambda t: t.thread_id != run.target.pid))  # the main thread first
    user, collective = _where(run.target, threads)
    kept = _keep(run.raw.with_suffix(".txt"), run.target, threads)
    return RankStacks(run.target, kept, threads, user, None, duration, collective, run.stopped_before)


def _keep(path: Path, target: StackTarget, threads: Sequence[ThreadStack]) -> Path | None:
    try:
        path.write_text(render(target, threads))
    except OSError:
        return None
    return path


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _failed(targets: Sequence[StackTarget], error: str) -> list[RankStacks]:
    return [RankStacks(t, None, (), None, error, 0.0) for t in targets]


def capture_stacks(
    targets: Sequence[StackTarget],
    out_dir: Path,
    *,
    timeout_s: float = 10.0,
    py_spy: Sequence[str] | None = None,
) -> list[RankStacks]:
    """Every target's stacks at once (one py-spy each, each with its own `timeout_s`), kept under `out_dir`
    as `rank<N>.txt` (plus py-spy's JSON). Never raises; a process py-spy stopped is always resumed.
    `py_spy`: the command to run (default: `find_py_spy()`)."""
    if not targets:
        return []
    command = list(py_spy) if py_spy else ([found] if (found := find_py_spy()) else [])
    if not command:
        return _failed(targets, f"py-spy is not installed: {PY_SPY_INSTALL}")
    if _yama_scope() == 3:
        return _failed(targets, ptrace_diagnosis())
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _failed(targets, f"cannot create {out_dir}: {exc.strerror or exc}")
    runs = [_start(t, command, out_dir) for t in targets]
    for run in runs:
        _finish(run, run.started + timeout_s, timeout_s)
    return [_result(run) for run in runs]


# --------------------------------------------------------------------------------------------------
# roles that only the stacks tell


def is_data_loader_worker(stacks: RankStacks) -> bool:
    """The process runs torch's data-loader worker loop (`_worker_loop`, torch/utils/data/_utils/worker.py)."""
    main = stacks.threads[0] if stacks.threads else None
    return main is not None and any(
        f.function.rsplit(".", 1)[-1] == "_worker_loop" and "/torch/utils/data/" in f.file.replace("\\", "/")
        for f in main.frames
    )


def settle_roles(stacks: Sequence[RankStacks]) -> tuple[list[RankStacks], list[StackTarget]]:
    """Data-loader workers are never ranks: a "rank" whose stack is torch's worker loop (a one-process job's
    workers look like mp.spawn's ranks from outside: Python children without a rank variable) becomes a `child`.
    Returns the stacks so relabelled and, for each worker whose ranks were all such children, the process that
    runs their loop (their parent) as the rank to dump next: the main process of a one-process job."""
    out: list[RankStacks] = []
    demoted: dict[str, set[int]] = {}  # worker name -> the parents of its data-loader workers
    for s in stacks:
        if s.target.role == "rank" and is_data_loader_worker(s):
            s = replace(s, target=replace(s.target, rank=None, local_rank=None, role="child"))
            stat = read_stat(s.target.pid)
            if stat is not None:
                demoted.setdefault(s.target.name, set()).add(stat.ppid)
        out.append(s)
    dumped = {s.target.pid for s in out}
    parents = [
        StackTarget(pid, None, None, gpus.pop() if len(gpus := _gpus_of(out, name)) == 1 else None, name)
        for name, pids in demoted.items()
        if not any(s.target.role == "rank" and s.target.name == name for s in out)
        for pid in sorted(pids - dumped)
    ]
    return out, parents


def _gpus_of(stacks: Sequence[RankStacks], name: str) -> set[int]:
    return {s.target.gpu for s in stacks if s.target.name == name and s.target.gpu is not None}


def capture_ranks(targets: Sequence[StackTarget], out_dir: Path, *, timeout_s: float = 10.0) -> list[RankStacks]:
    """`capture_stacks`, then `settle_roles`: the main process of a one-process job with data-loader workers is
    dumped and named (ranks first in the result)."""
    stacks, parents = settle_roles(capture_stacks(targets, out_dir, timeout_s=timeout_s))
    if parents:
        stacks = capture_stacks(parents, out_dir, timeout_s=timeout_s) + stacks
    order = {"rank": 0, "launcher": 1, "child": 2, "helper": 3}
    return sorted(stacks, key=lambda s: order.get(s.target.role, 4))

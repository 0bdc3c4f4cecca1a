"""False hangs: healthy jobs of the shapes users bring, each under a short `--hang-timeout`; none may end in 79.
Hung controls: jobs that do hang, each must end 79 within --hang-timeout + 60 s of the moment it hung.

The matrix (every healthy job runs for longer than its hang timeout, so a watch that misses its progress calls it
hung):

* `rank0-only`: per-gpu, 2 CPU workers, only rank 0 prints (every 1 s); rank 1 prints nothing.
* `only-gpu-hidden`: torchrun mode, `--only-gpu 0`, rank 0 silent and rank 1 (hidden from the terminal) printing.
* `tqdm-only`: a tqdm bar on a pipe (`\\r` redraws, no line end until the end).
* `native-c`: a compiled C program that printf's a step every 0.5 s (block-buffered on a pipe by default).
* `dots`: one `.` per step, never a line end.
* `eval-heartbeats`: a long evaluation that prints nothing and calls `podguard.rank.heartbeat()`.
* `lightning-rich`: Lightning's default bar (RichProgressBar: rich is installed), one CPU device.
* `rich-progress-pattern`: `rich.console.Console().print(f"step {i}")` under `--progress '^step \\d+'` (rich colours
  each number under podguard's TTY_COMPATIBLE: the watch must match the plain text).
* `multinode-rank0-only`: two nodes on loopback (torchrun mode, 2 ranks each), only global rank 0 prints.

Issue 30's shapes (`bench/_false_hang_shapes.py`), healthy:
1. `barrier-save-prints` (per-gpu, torchrun): both ranks beat; rank 0 saves 16 s printing every second while rank 1
   waits in `dist.barrier()`; `barrier-eval-busy`: rank 0 evaluates 16 s silently inside `busy()`.
2. `dots-torchrun`: a dot every 0.3 s in torchrun mode (the rank wrapper holds partial lines).
3. `filter-perl`, `filter-mawk`, `filter-sed`: `python steps.py | <filter>`; `cxx-no-sync`: C++ with
   `sync_with_stdio(false)`.
4. `stalled-stdout`: podguard's stdout a FIFO nobody reads, a chatty job (1 MB/s).
5. `silent-save`: `--max-runtime 20s` + `--save-signal` and a 16 s silent save under `--hang-timeout 8` (ends 124).
6. `rich-clocks`: a moving rich Progress with elapsed/remaining columns.
7. `rich-clocks-torchrun`: the same in torchrun mode.
and their hung controls: rank 0 stuck while rank 1 waits (1), dots then stuck (2), a mawk pipeline stuck (3), a
chatty job then stuck on the stalled stdout (4), hung before the guard (5), a stalled loop under rich's clocks
and under `console.status()` (6), a stalled `track()` in torchrun mode (7).

Earlier controls: `native-c, no line buffering` (PODGUARD_LINE_BUFFERING=0) and `lightning-rich, no TTY_*`
(TTY_COMPATIBLE=0) must be hung (the old behaviour, restored by its switch), and `rich-track stalled`, a `track()`
loop stuck in a step while rich's refresh thread redraws the same bar 10 times a second.

    python bench/bench_false_hangs.py              # every job twice, ~40 min on 2 busy cores
    python bench/bench_false_hangs.py --repeat 1 --only native-c,dots
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from loopback import cluster_node_env, free_port_pair  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import _false_hang_shapes as shapes  # noqa: E402

PY = sys.executable
PODGUARD = [PY, "-m", "podguard"]
HUNG = 79

RANK0_ONLY = """
import os, time
for i in range(9):
    if os.environ["RANK"] == "0":
        print(f"step {i}", flush=True)
    time.sleep(1)
"""
HIDDEN_RANK = """
import os, time
for i in range(16):
    if os.environ["RANK"] == "1":
        print(f"step {i}", flush=True)
    time.sleep(0.5)
"""
TQDM = """
import time
from tqdm import tqdm
for _ in tqdm(range(40)):
    time.sleep(0.2)
"""
STEPS_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { for (int i = 0; i < 16; i++) { printf("step %d\n", i); usleep(500000); } return 0; }
"""
DOTS = """
import sys, time
for _ in range(16):
    sys.stdout.write("."); sys.stdout.flush(); time.sleep(0.5)
"""
EVAL_HEARTBEATS = """
import time
from podguard.rank import heartbeat
print("evaluating", flush=True)
for i in range(16):
    time.sleep(0.5)
    heartbeat(i)
"""
RICH_STEPS = """
import time
from rich.console import Console
console = Console()
for i in range(16):
    console.print(f"step {i} loss 0.5")
    time.sleep(0.5)
"""
RICH_STALL = """
import time
from rich.progress import track
for i in track(range(10), description="train"):
    time.sleep(0.2 if i < 3 else 60)
"""
MULTINODE_RANK0 = """
import datetime, os, threading, time
rank = int(os.environ["RANK"])
loaded = threading.Event()
def say_loading():  # rank 0 logs while it starts (imports, rendezvous), as HF does
    while not loaded.wait(1.0):
        print("rank 0 loading", flush=True)
if rank == 0:
    threading.Thread(target=say_loading, daemon=True).start()
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
loaded.set()
for step in range(20):
    dist.all_reduce(torch.ones(1))
    if rank == 0 and step % 4 == 0:
        print(f"step {step}", flush=True)  # only global rank 0 logs, every 2 s
    time.sleep(0.5)
"""


@dataclass
class Job:
    name: str
    run: Callable[[Path], list[int]]  # the exit code of each podguard process (one per node)
    expect_hung: bool = False
    hang_timeout: float = 0.0  # a hung control's --hang-timeout: it must end within this + 60 s of hanging
    codes: list[list[int]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    after_hang: list[float] = field(default_factory=list)  # a hung control: seconds from its hang to podguard's exit


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PODGUARD_", "TTY_"))}
    env.update(PODGUARD_PROBE="off", PODGUARD_STATE_DIR=str(tmp / "state"), LD_LIBRARY_PATH="", **extra)
    for var in ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _podguard(tmp: Path, args: list[str], *, stdout: int | None = None, **extra: str) -> list[int]:
    env = _env(tmp, HANG_MARK=str(tmp / "hung_at"), OMP_NUM_THREADS="1", **extra)
    out = subprocess.PIPE if stdout is None else stdout
    proc = subprocess.run(
        [*PODGUARD, *args], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, timeout=300
    )
    (tmp / "ended_at").write_text(repr(time.time()))
    return [proc.returncode]


def _on_stalled_fifo(tmp: Path, args: list[str]) -> list[int]:
    """podguard with its stdout on a FIFO whose reader never reads (a log collector that stopped)."""
    fifo = tmp / "collector.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    try:
        return _podguard(tmp, args, stdout=writer)
    finally:
        os.close(writer)
        os.close(reader)


def _script(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _native(tmp: Path) -> str:
    src = tmp / "steps.c"
    src.write_text(STEPS_C)
    subprocess.run(["gcc", "-O1", "-o", str(tmp / "steps"), str(src)], check=True)
    return str(tmp / "steps")


def _multinode(tmp: Path) -> list[int]:
    script = _script(tmp, "mn.py", MULTINODE_RANK0)
    port = free_port_pair()
    args = ["train", "--mode", "torchrun", "--grace", "2", "--hang-timeout", "7", "--", PY, script]
    logs = [(tmp / f"node{rank}.out").open("w") for rank in (0, 1)]
    procs = [
        subprocess.Popen(
            [*PODGUARD, *args],
            env=cluster_node_env(tmp, rank, port),
            stdin=subprocess.DEVNULL,
            stdout=logs[rank],
            stderr=subprocess.STDOUT,
        )
        for rank in (0, 1)
    ]
    codes = [proc.wait(timeout=300) for proc in procs]
    for rank, log in enumerate(logs):
        log.close()
        if codes[rank] == HUNG:  # say why, for the reader of the table
            hung = [ln for ln in (tmp / f"node{rank}.out").read_text().splitlines() if "HUNG" in ln]
            print(f"multinode node {rank}: {hung[:1]}", file=sys.stderr)
    return codes


def _run(
    *args: str, script: str = "", native: bool = False, job_args: tuple[str, ...] = (), **env: str
) -> Callable[[Path], list[int]]:
    """One podguard run: ARGS -- the job (a Python script body, or the compiled C program) JOB_ARGS."""

    def go(tmp: Path) -> list[int]:
        job = [PY, _script(tmp, "job.py", script)] if script else [_native(tmp)] if native else []
        return _podguard(tmp, [*args, *(["--", *job, *job_args] if job else [])], **env)

    return go


def _pipeline(filt: str, then: str) -> Callable[[Path], list[int]]:
    """`python steps.py | FILT` under `podguard run --hang-timeout 5` (shape 3)."""

    def go(tmp: Path) -> list[int]:
        job = _script(tmp, "steps.py", shapes.STEPS)
        steps = "28" if then == "exit" else "4"
        pipeline = f"{PY} {job} {steps} {then} | {filt}"
        return _podguard(tmp, ["run", "--hang-timeout", "5", "--grace", "1", "--", "bash", "-c", pipeline])

    return go


def _cxx(tmp: Path) -> list[int]:
    src = tmp / "steps.cc"
    src.write_text(shapes.CXX)
    subprocess.run(["g++", "-O1", "-o", str(tmp / "steps"), str(src)], check=True)
    return _podguard(tmp, ["run", "--hang-timeout", "5", "--grace", "1", "--", str(tmp / "steps")])


def _stalled_stdout(then: str) -> Callable[[Path], list[int]]:
    def go(tmp: Path) -> list[int]:
        job = _script(tmp, "chatty.py", shapes.CHATTY)
        return _on_stalled_fifo(tmp, ["run", "--hang-timeout", "8", "--grace", "2", "--", PY, job, then])

    return go


def _silent_save(then: str) -> Callable[[Path], list[int]]:
    def go(tmp: Path) -> list[int]:
        job = _script(tmp, "saver.py", shapes.SILENT_SAVE)
        args = [
            "run", "--checkpoints", str(tmp / "ckpt"), "--save-signal", "USR1", "--save-grace", "60s",
            "--max-runtime", "20s", "--hang-timeout", "8", "--grace", "2", "--", PY, job, str(tmp / "ckpt"), then,
        ]  # fmt: skip
        return _podguard(tmp, args)

    return go


def jobs() -> list[Job]:
    lightning = ("--", PY, str(ROOT / "tests" / "frameworks" / "lightning_job.py"), "healthy", "1", "0.25")
    have = {m: importlib.util.find_spec(m) is not None for m in ("torch", "tqdm", "lightning", "rich")}
    per_gpu = ("train", "--mode", "per-gpu", "--cpu-workers", "2", "--hang-timeout", "3")
    hidden = ("train", "--mode", "torchrun", "--cpu-workers", "2", "--only-gpu", "0", "--hang-timeout", "4")
    run3 = ("run", "--hang-timeout", "3")
    out = [
        Job("rank0-only", _run(*per_gpu, script=RANK0_ONLY)),
        Job("dots", _run(*run3, script=DOTS)),
        Job("eval-heartbeats", _run(*run3, script=EVAL_HEARTBEATS)),
    ]
    if shutil.which("gcc"):
        out.append(Job("native-c", _run(*run3, native=True)))
        control = _run(*run3, native=True, PODGUARD_LINE_BUFFERING="0")
        out.append(Job("native-c, no line buffering (control)", control, expect_hung=True))
    if have["tqdm"]:
        out.append(Job("tqdm-only", _run(*run3, script=TQDM)))
    if have["torch"]:
        out.append(Job("only-gpu-hidden", _run(*hidden, script=HIDDEN_RANK)))
        out.append(Job("multinode-rank0-only", _multinode))
    if have["lightning"] and have["rich"]:
        out.append(Job("lightning-rich", _run("run", "--hang-timeout", "6", *lightning)))
        control = _run("run", "--hang-timeout", "6", *lightning, TTY_COMPATIBLE="0")
        out.append(Job("lightning-rich, no TTY_* (control)", control, expect_hung=True))
    if have["rich"]:
        out.append(Job("rich-progress-pattern", _run(*run3, "--progress", r"^step \d+", script=RICH_STEPS)))
        out.append(Job("rich-track stalled (control)", _run(*run3, script=RICH_STALL), expect_hung=True))
    return out + issue30_jobs(have)


def issue30_jobs(have: dict[str, bool]) -> list[Job]:
    """Shapes 1-7 of issue 30 (bench/_false_hang_shapes.py), healthy ones and hung controls."""
    per_gpu = ("train", "--mode", "per-gpu", "--cpu-workers", "2", "--hang-timeout", "8", "--grace", "2")
    torchrun = ("train", "--mode", "torchrun", "--cpu-workers", "2", "--hang-timeout", "8", "--grace", "2")
    torchrun1 = ("train", "--mode", "torchrun", "--cpu-workers", "1", "--hang-timeout", "8", "--grace", "1")
    run5 = ("run", "--hang-timeout", "5", "--grace", "1")
    out: list[Job] = []

    def hung(name: str, run: Callable[[Path], list[int]], timeout: float) -> None:
        out.append(Job(f"{name} (control)", run, expect_hung=True, hang_timeout=timeout))

    if have["torch"]:  # 1: a rank waits in a barrier while rank 0 works alone

        def ranks(mode: tuple[str, ...], how: str) -> Callable[[Path], list[int]]:
            return _run(*mode, script=shapes.RANKS, job_args=(how,))

        out.append(Job("1 barrier-save-prints per-gpu", ranks(per_gpu, "save-prints")))
        out.append(Job("1 barrier-save-prints torchrun", ranks(torchrun, "save-prints")))
        out.append(Job("1 barrier-eval-busy per-gpu", ranks(per_gpu, "eval-busy")))
        hung("1 rank 0 stuck, rank 1 waits", ranks(per_gpu, "stuck"), 8)
    out.append(Job("2 dots-torchrun", _run(*torchrun1, script=shapes.DOTS, job_args=("exit",))))  # 2: dots
    hung("2 dots-torchrun then stuck", _run(*torchrun1, script=shapes.DOTS, job_args=("hang",)), 8)
    for filt, command in (("perl", "perl -pe 's/^/[train] /'"), ("mawk", "mawk '{print strftime(), $0}'")):
        if shutil.which(filt):  # 3: filters in the job's own pipeline
            out.append(Job(f"3 filter-{filt}", _pipeline(command, "exit")))
    out.append(Job("3 filter-sed", _pipeline("sed 's/^/[train] /'", "exit")))
    if shutil.which("g++"):
        out.append(Job("3 cxx-no-sync", _cxx))
    if shutil.which("mawk"):
        hung("3 filter-mawk stuck", _pipeline("mawk '{print strftime(), $0}'", "hang"), 5)
    out.append(Job("4 stalled-stdout", _stalled_stdout("exit")))  # 4: the terminal
    hung("4 stalled-stdout then stuck", _stalled_stdout("hang"), 8)
    out.append(Job("5 silent-save (ends 124)", _silent_save("exit")))  # 5: the save podguard asked for
    hung("5 hung before the guard", _silent_save("hang"), 8)
    if have["rich"]:  # 6, 7: live displays
        out.append(Job("6 rich-clocks", _run(*run5, script=shapes.LIVE, job_args=("clocks", "exit"))))
        hung("6 rich-clocks stalled", _run(*run5, script=shapes.LIVE, job_args=("clocks", "hang")), 5)
        hung("6 rich-status stalled", _run(*run5, script=shapes.LIVE, job_args=("status", "hang")), 5)
        out.append(Job("7 rich-clocks torchrun", _run(*torchrun1, script=shapes.LIVE, job_args=("clocks", "exit"))))
        hung("7 rich-track torchrun stalled", _run(*torchrun1, script=shapes.LIVE, job_args=("track", "hang")), 8)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated job names")
    args = parser.parse_args()
    chosen = [j for j in jobs() if not args.only or j.name.split(",")[0] in args.only.split(",")]
    for _ in range(args.repeat):  # rounds interleaved: a neighbour's load hits every job alike
        for job in chosen:
            with tempfile.TemporaryDirectory(prefix="podguard-falsehang-") as tmp:
                started = time.monotonic()
                job.codes.append(job.run(Path(tmp)))
                job.walls.append(time.monotonic() - started)
                mark, ended = Path(tmp) / "hung_at", Path(tmp) / "ended_at"
                if job.expect_hung and mark.exists() and ended.exists():
                    job.after_hang.append(float(ended.read_text()) - float(mark.read_text()))
    print(f"{'job':<42} {'runs':>4} {'hung':>4} {'false hangs':>11} {'exit codes':>14} {'median s':>9}")
    false_total = 0
    for job in chosen:
        hung = sum(1 for codes in job.codes if HUNG in codes)
        false = 0 if job.expect_hung else hung
        false_total += false
        codes = ",".join("/".join(map(str, c)) for c in job.codes)
        print(
            f"{job.name:<42} {len(job.codes):>4} {hung:>4} {false:>11} {codes:>14} {statistics.median(job.walls):>9.1f}"
        )
    controls = [j for j in chosen if j.expect_hung]
    missed = sum(1 for j in controls for codes in j.codes if HUNG not in codes)
    print(f"false hangs: {false_total}; controls not found hung (should be 0): {missed}")
    timed = [j for j in controls if j.hang_timeout and j.after_hang]
    if timed:
        print(f"\n{'hung control':<42} {'hang timeout':>12} {'exit after the hang, s':>24}")
        for job in timed:
            print(f"{job.name:<42} {job.hang_timeout:>12g} {', '.join(f'{t:.1f}' for t in job.after_hang):>24}")
        late = sum(1 for j in timed for t in j.after_hang if t > j.hang_timeout + 60)
        worst = max(t - j.hang_timeout for j in timed for t in j.after_hang)
        print(f"hung controls ended later than --hang-timeout + 60 s: {late} (worst: timeout + {worst:.1f} s)")


if __name__ == "__main__":
    main()

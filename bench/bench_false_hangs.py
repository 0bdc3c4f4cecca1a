"""False hangs: healthy jobs of the shapes users bring, each under a short `--hang-timeout`; none may end in 79.

The matrix (every job healthy, each runs for longer than its hang timeout, so a watch that misses its progress
calls it hung):

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

Two controls show the watch is live (they must be hung: the old behaviour, restored by its switch):
`native-c, no line buffering` (PODGUARD_LINE_BUFFERING=0) and `lightning-rich, no TTY_*` (TTY_COMPATIBLE=0); and
one real hang that must be found: `rich-track stalled`, a `track()` loop stuck in a step while rich's refresh
thread redraws the same bar 10 times a second.

    python bench/bench_false_hangs.py              # every job twice, ~4 min on 2 busy cores
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
    codes: list[list[int]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PODGUARD_", "TTY_"))}
    env.update(PODGUARD_PROBE="off", PODGUARD_STATE_DIR=str(tmp / "state"), LD_LIBRARY_PATH="", **extra)
    for var in ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _podguard(tmp: Path, args: list[str], **extra: str) -> list[int]:
    proc = subprocess.run(
        [*PODGUARD, *args], env=_env(tmp, **extra), stdin=subprocess.DEVNULL, capture_output=True, timeout=300
    )
    return [proc.returncode]


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


def _run(*args: str, script: str = "", native: bool = False, **env: str) -> Callable[[Path], list[int]]:
    """One podguard run: ARGS -- the job (a Python script body, or the compiled C program)."""

    def go(tmp: Path) -> list[int]:
        job = [PY, _script(tmp, "job.py", script)] if script else [_native(tmp)] if native else []
        return _podguard(tmp, [*args, *(["--", *job] if job else [])], **env)

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


if __name__ == "__main__":
    main()

"""The job shapes of issue 30 for bench_false_hangs.py (healthy ones, and hung controls that must end): a rank that
waits in a barrier while rank 0 works alone, dots in torchrun mode, filters in the job's pipeline, a stalled
terminal, a silent save podguard asked for, and live displays whose clock or spinner runs while the loop is stuck.

A hung control writes the time it hangs into $HANG_MARK: the bench measures from there to podguard's exit
(the contract: within --hang-timeout + 60 s).
"""

from __future__ import annotations

RANKS = """
import datetime, os, sys, time
import torch, torch.distributed as dist
from podguard.rank import busy, heartbeat
how = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank = dist.get_rank()
for step in range(3):
    dist.all_reduce(torch.ones(1))
    heartbeat(step)
    print(f"rank {rank} step {step}", flush=True)
if rank == 0:
    if how == "save-prints":  # shape 1: a 16 s save printing every second
        for i in range(16):
            print(f"saving {i}/16", flush=True)
            time.sleep(1)
    elif how == "eval-busy":  # shape 1: a silent 16 s evaluation, announced
        with busy("evaluating", max_s=120):
            time.sleep(16)
    else:  # control: rank 0 is stuck, silent
        open(os.environ["HANG_MARK"], "w").write(repr(time.time()))
        time.sleep(3600)
dist.barrier()
heartbeat(3)
dist.barrier()
dist.destroy_process_group()
"""
DOTS = """
import os, sys, time
for i in range(40):
    sys.stdout.write("."); sys.stdout.flush(); time.sleep(0.3)
if sys.argv[1] == "hang":
    open(os.environ["HANG_MARK"], "w").write(repr(time.time()))
    time.sleep(3600)
"""
STEPS = """
import os, sys, time
for i in range(int(sys.argv[1])):
    print(f"step {i}", flush=True)
    time.sleep(0.5)
if sys.argv[2] == "hang":
    open(os.environ["HANG_MARK"], "w").write(repr(time.time()))
    time.sleep(3600)
"""
CXX = r"""
#include <iostream>
#include <unistd.h>
int main() {
    std::ios_base::sync_with_stdio(false);
    for (int i = 0; i < 32; i++) { std::cout << "step " << i << "\n"; usleep(500000); }
    return 0;
}
"""
CHATTY = """
import os, sys, time
line = "x" * 100
n, start = 0, time.monotonic()
while time.monotonic() - start < 16:
    sys.stdout.write("".join(f"line {n + i} {line}\\n" for i in range(100)))
    sys.stdout.flush()
    n += 100
    time.sleep(0.01)
if sys.argv[1] == "hang":
    open(os.environ["HANG_MARK"], "w").write(repr(time.time()))
    time.sleep(3600)
"""
SILENT_SAVE = """
import os, pathlib, signal, sys, time, zipfile
ckpt = pathlib.Path(sys.argv[1])
asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
step = 0
while not asked:
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.5)
    if sys.argv[2] == "hang" and step == 4:  # control: hung before the guard fires
        open(os.environ["HANG_MARK"], "w").write(repr(time.time()))
        time.sleep(3600)
time.sleep(16)  # a silent save, longer than --hang-timeout
ckpt.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(ckpt / f"step-{step}.pt", "w") as zf:
    zf.writestr("archive/data.pkl", b"x" * 100)
time.sleep(3600)
"""
LIVE = """
import os, sys, time
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn, track
shape, stall = sys.argv[1], sys.argv[2] == "hang"

def wait(i):
    if stall and i == 3:
        open(os.environ["HANG_MARK"], "w").write(repr(time.time()))
        time.sleep(3600)
    time.sleep(0.3)

if shape == "clocks":  # shape 6: a Progress whose elapsed and remaining columns tick
    columns = (SpinnerColumn(), TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("train", total=40)
        for i in range(40):
            progress.advance(task)
            wait(i)
elif shape == "status":  # shape 6: console.status()'s spinner
    for i in range(40):
        with Console().status(f"step {i}: working"):
            wait(i)
else:  # shape 7: track(), under torchrun's rank0: prefix
    for i in track(range(40), description="train"):
        wait(i)
"""

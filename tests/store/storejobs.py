"""The job the store's end-to-end tests run under `podguard run`: plain torch, a `step-<N>.pt` file every EVERY
steps (written to a hidden name, then renamed) and on the save signal; it resumes from PODGUARD_RESUME_FROM.

    args = ["run", "--checkpoints", d, "--checkpoint-store", url, "--", *job_argv(tmp_path, steps=9, every=3)]
"""

from __future__ import annotations

import sys
from pathlib import Path

JOB = """
import os, signal, sys, time
# a save signal that comes while torch is imported (a busy machine) waits for the handler instead of killing the job
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
import torch
from podguard.rank import SaveRequest, resume_from

request = SaveRequest()
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
d = os.environ["PODGUARD_CHECKPOINTS"]
steps, every, step_s, size = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
start = 1
if (path := resume_from()) is not None:
    state = torch.load(path, weights_only=True)
    start = state["step"] + 1
    print(f"resumed from step {state['step']} ({os.path.basename(path)})", flush=True)
else:
    print("from scratch", flush=True)
os.makedirs(d, exist_ok=True)
for step in range(start, steps + 1):
    time.sleep(step_s)
    print(f"step {step}", flush=True)
    if step % every == 0 or request.take():
        tmp = os.path.join(d, f".step-{step}.pt.tmp")
        torch.save({"step": step, "w": torch.full((size,), float(step))}, tmp)
        os.replace(tmp, os.path.join(d, f"step-{step}.pt"))
        print(f"saved step {step}", flush=True)
print("done", flush=True)
"""


def job_argv(tmp_path: Path, *, steps: int, every: int, step_s: float = 0.0, size: int = 1000) -> list[str]:
    path = tmp_path / "store_job.py"
    if not path.exists():
        path.write_text(JOB)
    return [sys.executable, str(path), str(steps), str(every), str(step_s), str(size)]

"""A real NCCL job for bench/device_progress.sh: one all-reduce per step, a `step N` line and a heartbeat each,
for STEPS steps (default 40, 0.5 s apart). Run by `podguard train --mode torchrun` (one rank per GPU)."""

import os
import time

import torch
import torch.distributed as dist

from podguard.rank import heartbeat

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
x = torch.ones(1 << 20, device="cuda")
print(f"rank {rank}: warming up (not progress for ^step)", flush=True)
for step in range(int(os.environ.get("STEPS", "40"))):
    dist.all_reduce(x)
    torch.cuda.synchronize()
    heartbeat(step)
    print(f"step {step} sum {x[0].item():.0f}", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()

"""A real NCCL job that hangs, for `bench/device_watch.sh` (one rank per GPU; one GPU is enough).

Each rank runs a few all-reduces on its GPU (the flight recorder records them), prints a line per step, then
gets stuck in its own "data loader" (a sleep in user code): the job prints nothing more and podguard's
`--hang-timeout` finds it, keeps the stacks and asks torch for its flight-recorder dump.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist


def load_next_batch() -> None:
    time.sleep(3600)  # the stuck data loader


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=1800))
    rank = dist.get_rank()
    x = torch.ones(1 << 20, device="cuda")
    for step in range(3):
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print(f"rank {rank} step {step} sum {x[0].item():.0f}", flush=True)
    load_next_batch()


if __name__ == "__main__":
    main()

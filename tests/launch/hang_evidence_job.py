"""A gloo job with one stuck rank, for tests/launch/test_hang_evidence.py (run it, never import it).

Every rank joins a gloo process group; the rank named by HANG_STUCK_RANK (default 1) then sleeps in
`load_batch` (user code, never reaching the collective) while the others wait in `dist.all_reduce` inside
`step`. Each rank prints `ready <rank> <pid>` just before it blocks.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def load_batch() -> None:
    """The stuck rank: user code that never returns (a data loader that hangs)."""
    while True:
        time.sleep(0.05)


def step(tensor: torch.Tensor) -> None:
    """The healthy ranks: wait in the collective for the stuck one."""
    dist.all_reduce(tensor)


def heartbeat() -> None:
    """A second thread, so the dump has more than one."""
    while True:
        time.sleep(0.2)


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    print(f"ready {rank} {os.getpid()}", flush=True)
    if rank == int(os.environ.get("HANG_STUCK_RANK", "1")):
        load_batch()
    step(torch.ones(4))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of the node's all-reduce probe: `python -m podguard.preflight.gate.probe.allreduce_child --rank R
--world N --store PATH --backend nccl --bytes B --target-s S`, started by `run_allreduce` (probe/allreduce.py).

With NCCL, rank R uses cuda:R of the selected GPUs (all of them visible, so NCCL can use NVLink/P2P between
peers); with gloo it runs on the CPU (CI). Rendezvous through a FileStore in the parent's temp dir: no port
to pick, nothing to race for. The ranks warm up (the first all-reduce builds the communicator), agree on one
iteration count (each rank's estimate, all-reduced with MAX: every rank must make the same number of calls),
time that many in-place all-reduces of the buffer, then check one all-reduce of known values. It prints one
JSON line (`ok`, `rank`, `world`, `bytes`, `iterations`, `seconds` per all-reduce, `device`, `error`) and
exits 0 or 1, never with a traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from datetime import timedelta
from functools import partial
from typing import Any

from podguard.preflight.gate.probe.jsonline import one_json_line

WARMUP_ITERATIONS = 3
MIN_ITERATIONS, MAX_ITERATIONS = 3, 200


class AllreduceFailure(Exception):
    """A wrong all-reduce result, with the message the report will show."""


def run(rank: int, world: int, store_path: str, backend: str, nbytes: int, target_s: float) -> dict[str, Any]:
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch  # noqa: PLC0415  lazy: torch, after the NumPy warning filter (the child's own process)
    import torch.distributed as dist  # noqa: PLC0415  lazy: torch, after the NumPy warning filter (the child's own process)

    from podguard.preflight.gate.probe.measure import timed  # noqa: PLC0415  lazy: imports torch at its top

    if backend == "nccl":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible < world:
            build = torch.version.cuda or "no (CPU-only build)"
            raise AllreduceFailure(
                f"NCCL needs {world} visible GPUs, CUDA sees {visible} (torch {torch.__version__}, CUDA build: {build})"
            )
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), "cpu"
    store = dist.FileStore(store_path, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(minutes=5))
    try:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros: sums stay zero however many

        def allreduce() -> None:
            dist.all_reduce(buf)

        timed(allreduce, WARMUP_ITERATIONS, device)
        estimate = torch.tensor([timed(allreduce, 2, device) / 2], dtype=torch.float64, device=device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX)  # also lines the ranks up before the timed batch
        per_call = float(estimate.item())
        iterations = max(MIN_ITERATIONS, min(MAX_ITERATIONS, round(target_s / per_call) if per_call > 0 else 0))
        seconds = timed(allreduce, iterations, device) / iterations

        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        expected = world * (world + 1) / 2
        if not bool((buf == expected).all()):
            wrong = int((buf != expected).sum())
            raise AllreduceFailure(
                f"all-reduce of {world} ranks: {wrong} of {buf.numel()} sums differ from {expected:g}"
            )
    finally:
        dist.destroy_process_group()
    return {"world": world, "bytes": buf.numel() * 4, "iterations": iterations, "seconds": seconds, "device": name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="allreduce_child")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--target-s", type=float, default=0.2)
    args = parser.parse_args(argv)
    work = partial(run, args.rank, args.world, args.store, args.backend, args.bytes, args.target_s)
    return one_json_line(work, AllreduceFailure, {"rank": args.rank})


if __name__ == "__main__":
    sys.exit(main())

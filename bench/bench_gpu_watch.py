"""The run-time GPU fault watch's cost: µs per `GpuFaultWatch.poll()` and the share of a core at its interval.

Issue 19's target: the supervisor's watches under 1 % of a core. The watch polls once per POLL_INTERVAL_S: one
0 ms NVML event wait, then per GPU the recovery-action field and the uncorrected ECC count. This measures the whole
poll (Python + the binding + the library) in-process, on the fake 8-GPU node by default, or on this machine's real
NVML with `--real` (all its GPUs), plus its parts: the event drain alone and one GPU's health query.

Run: `python bench/bench_gpu_watch.py [--polls N] [--gpus N] [--real]`
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable

from _common import ROOT, fake_node

sys.path.insert(0, str(ROOT / "entrypoint"))

from podguard.gpu.backend import NvmlUnavailable
from podguard.gpu.nvml import NvmlBackend
from podguard.launch.watch.gpu_faults import POLL_INTERVAL_S, GpuFaultWatch

BATCH = 100


def per_call_us(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(median wall µs, median CPU µs) per call over batches of BATCH calls."""
    walls, cpus = [], []
    for _ in range(max(1, calls // BATCH)):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(BATCH):
            fn()
        walls.append((time.perf_counter() - w0) / BATCH * 1e6)
        cpus.append((time.process_time() - c0) / BATCH * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def bench(
    backend: NvmlBackend, gpus: list[tuple[int, str | None]], polls: int, calls: Callable[[], int] | None
) -> None:
    watch = GpuFaultWatch(backend, gpus)
    events = None
    try:
        for _ in range(10):  # warm: handles cached, n/a queries remembered
            watch.poll()
        before = calls() if calls else 0
        wall, cpu = per_call_us(watch.poll, polls)
        per_poll = (calls() - before) / (max(1, polls // BATCH) * BATCH) if calls else None
        events = backend.open_xid_events([i for i, _ in gpus])
        drain = per_call_us(events.poll, polls) if events is not None else None
        health = per_call_us(lambda: backend.health(gpus[0][0]), polls)
    finally:
        watch.close()
        if events is not None:
            events.close()
    print(f"GPUs watched: {len(gpus)}; poll interval {POLL_INTERVAL_S:g} s; xid events: {events is not None}")
    if per_poll is not None:
        print(f"NVML calls per poll: {per_poll:.0f}")
    print(f"{'part':<34} {'wall µs':>9} {'CPU µs':>9}")
    print(f"{'whole poll':<34} {wall:>9.1f} {cpu:>9.1f}")
    if drain is not None:
        print(f"{'  event drain (0 ms wait)':<34} {drain[0]:>9.1f} {drain[1]:>9.1f}")
    print(f"{'  health of one GPU':<34} {health[0]:>9.1f} {health[1]:>9.1f}")
    share = cpu / 1e6 / POLL_INTERVAL_S * 100
    print(f"share of a core at one poll per {POLL_INTERVAL_S:g} s: {share:.4f} % (target < 1 %)")
    if watch.unknown:
        print(f"unknown: {watch.unknown}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs on the fake node")
    parser.add_argument("--real", action="store_true", help="this machine's NVML, all its GPUs")
    args = parser.parse_args()
    if args.real:
        try:
            real = NvmlBackend()
        except NvmlUnavailable as exc:
            print(f"no real NVML here: {exc.message}", file=sys.stderr)
            return 1
        with real as backend:
            gpus = [(i, backend.snapshot(i).uuid) for i in range(backend.device_count())]
            print(f"real NVML, driver {backend.driver().driver_version}")
            bench(backend, gpus, args.polls, None)
        return 0
    node = fake_node(args.gpus)
    try:
        os.environ.update({k: v for k, v in node.env_vars().items() if k.startswith(("FAKE_", "PODGUARD_"))})
        lib = ctypes.CDLL(str(node.library))
        lib.fakeNvmlCallCount.restype = ctypes.c_ulonglong
        with NvmlBackend(library_path=node.library) as backend:
            print("fake NVML (tests/fakenvml): each call also stat()s the scenario file")
            gpus = [(g.index, g.uuid) for g in node.scenario.gpus]
            bench(backend, gpus, args.polls, lib.fakeNvmlCallCount)
    finally:
        node.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

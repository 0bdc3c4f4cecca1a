"""Preflight speed on a fake healthy 8×H100 node, as whole processes, side by side with the seeds' detection.

Issue #2's targets: `podguard gpus --json` and a full preflight without the CUDA probe at least 10× faster
than `python -c "import torch; print(torch.cuda.device_count())"`; the preflight's own work (the JSON
report's `timings_ms.total`, interpreter start-up and imports excluded) under 30 ms; and the preflight path
importing neither torch, nor runpod, nor docker (`python -X importtime`).

Also the NVML cost of one 8-GPU snapshot round in-process (the gate's degraded checks read the snapshot's
fields: issue 13's budget is that they add no measurable time): NVML calls per GPU (exact, counted by the
fake) and milliseconds per round.

Run: `python bench/bench_preflight.py [--repeats N]`
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

from _common import PODGUARD, fake_node, interleaved, node_env, summarize

from fakenvml.node import NvmlNode

FORBIDDEN = ("torch", "runpod", "docker")


def imported_modules(argv: list[str], env: dict[str, str]) -> set[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    mods = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return mods


def snapshot_cost(node: NvmlNode, rounds: int = 200) -> str:
    """NVML calls per GPU snapshot and ms per 8-GPU round, in this process against the fake library."""
    os.environ.update(node.env_vars())
    from podguard.gpu.nvml import NvmlBackend

    counter = ctypes.CDLL(str(node.library))
    counter.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    with NvmlBackend(library_path=str(node.library)) as backend:
        count = backend.device_count()
        for i in range(count):  # handles and the NVLink link count are read once per process
            backend.snapshot(i)
        before = counter.fakeNvmlCallCount()
        for i in range(count):
            backend.snapshot(i)
        calls = (counter.fakeNvmlCallCount() - before) / count
        started = time.perf_counter()
        for _ in range(rounds):
            for i in range(count):
                backend.snapshot(i)
        per_round = (time.perf_counter() - started) / rounds * 1000
    return f"NVML snapshot in-process: {calls:.0f} calls per GPU, {per_round:.2f} ms per {count}-GPU round"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    node = fake_node(8)
    try:
        env = node_env(node)
        seed = [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"]
        gpus = [*PODGUARD, "gpus", "--json"]
        preflight = [*PODGUARD, "run", "--probe", "off", "--", "true"]
        times = interleaved(
            {
                "seed: import torch; cuda.device_count()": (seed, env),
                "podguard gpus --json": (gpus, env),
                "podguard run --probe off -- true (preflight+launch)": (preflight, env),
                "podguard health --probe off": ([*PODGUARD, "health", "--probe", "off"], env),
            },
            args.repeats,
        )
        print(f"fake node: 8 GPUs, {args.repeats} interleaved rounds, whole processes")
        print(summarize(times, baseline="seed: import torch; cuda.device_count()"))

        reports = sorted((node.root / "state" / "reports").glob("*-run.json"))
        work = [json.loads(p.read_text())["timings_ms"] for p in reports]
        totals = [w["total"] for w in work]
        print(
            f"preflight's own work (report timings_ms.total, {len(totals)} runs): "
            f"median {statistics.median(totals):.1f} ms, max {max(totals):.1f} ms  (target < 30 ms)"
        )
        phases = {k: statistics.median(w.get(k, 0.0) for w in work) for k in work[-1] if k != "total"}
        print("  median per phase: " + ", ".join(f"{k} {v:.1f} ms" for k, v in phases.items()))
        print(snapshot_cost(node))
        for argv in (gpus, preflight):
            bad = sorted(imported_modules(argv, env) & set(FORBIDDEN))
            verdict = "IMPORTS " + ", ".join(bad) if bad else "none of " + "/".join(FORBIDDEN)
            print(f"imports on `{' '.join(argv[2:])}`: {verdict}")
    finally:
        node.teardown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the metrics cost (issue 26): a scrape's time, and the supervisor's CPU with a scrape every 5 s.

    python bench/bench_metrics.py             # on the fake 8-GPU node (the test suite's libnvidia-ml.so.1)

1. Formatting alone, in-process: `render()` of a snapshot with 8 GPUs (every gauge), 8 ranks and an Xid (what a
   scrape does on podguard's side), in ms.
2. A real `podguard train --mode per-gpu` on 8 fake GPUs, 8 ranks each calling heartbeat(step) 10 times a second:
   the wall time of each HTTP scrape from a client (connection included), one every SCRAPE_EVERY_S; and the
   supervisor process's CPU (all its threads: the loop, the GPU poller, the metrics server) over the same window,
   with and without `--metrics-port`, as % of one core. Targets (PRODUCT.md): < 20 ms a scrape, < 1 % of a core.

BENCH_METRICS_WINDOW_S sets each window (default 30 s; at least a few scrapes).
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from _common import PODGUARD, ROOT, fake_node, node_env
from bench_guards import cpu_s, table

sys.path.insert(0, str(ROOT / "entrypoint"))

WINDOW_S = float(os.environ.get("BENCH_METRICS_WINDOW_S", "30"))
SCRAPE_EVERY_S = 5.0
RANKS = 8
JOB = """
import os, sys, time
from podguard.rank import heartbeat
print("job ready", flush=True)
step = 0
while True:
    heartbeat(step)
    step += 1
    time.sleep(0.1)
"""


def render_ms(rounds: int = 500) -> tuple[float, int]:
    """(median ms per render of a full 8-GPU, 8-rank snapshot, its size in bytes)."""
    from podguard.guards.budget import Budget, Meter
    from podguard.launch.watch.gpu_faults import GpuFault
    from podguard.metrics.exposition import render, snapshot_registry
    from podguard.metrics.state import GpuRow, MetricsState
    from podguard.rank.progress import Beat

    state = MetricsState(version="0.1.0", mode="per-gpu", pod_id="abc123")
    state.begin_attempt(0, "per-gpu", [GpuRow(i, f"GPU-{i:08d}", "NVIDIA H100 80GB HBM3") for i in range(8)])

    class Gpus:  # the four gauges as NVML would give them
        def utilization(self, i: int) -> int:
            return 90

        def memory_used(self, i: int) -> int:
            return 70 << 30

        def sensors(self, i: int) -> tuple[float, int]:
            return 650.5, 71

    now = time.monotonic()
    runtime = SimpleNamespace(  # what the run-time watch holds a few minutes into a run
        beats={s: Beat(s, 1000 + s, 990 + s, now, 100 + s, s) for s in range(RANKS)},
        faults=[GpuFault(3, "GPU-00000003", "xid", 13, False, "GPU 3: Xid 13", now)],
        progress=SimpleNamespace(labels={s: s for s in range(RANKS)}, seen=True, last_at=now),
        rates=SimpleNamespace(slow={5: None}),
    )

    state.read_gpus(Gpus())  # type: ignore[arg-type]
    state.observe(runtime)  # type: ignore[arg-type]
    state.set_price(Budget("pod1", (Meter("pod1", 3.52, 3600.0),), time.monotonic()))
    registry = snapshot_registry(state)
    size = len(render(registry))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        render(registry)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def run_window(env: dict[str, str], job: Path, port: int | None) -> tuple[float, list[float]]:
    """(% of a core the supervisor used over WINDOW_S, each scrape's wall ms) of one run of the heartbeat job."""
    metrics = ["--metrics-port", str(port)] if port is not None else []
    argv = [*PODGUARD, "train", "--mode", "per-gpu", *metrics, "--", sys.executable, str(job)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    scrapes: list[float] = []
    try:
        assert proc.stdout is not None
        ready = 0
        for line in proc.stdout:  # every rank started
            ready += "job ready" in line
            if ready == RANKS:
                break
        time.sleep(3.0)  # start-up's last work (log threads, the first GPU read) done
        before, started = cpu_s(proc.pid), time.monotonic()
        next_scrape = started
        while (now := time.monotonic()) < started + WINDOW_S:
            if port is not None and now >= next_scrape:
                t0 = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    resp.read()
                scrapes.append((time.perf_counter() - t0) * 1000)
                next_scrape += SCRAPE_EVERY_S
            time.sleep(max(0.0, min(next_scrape, started + WINDOW_S) - time.monotonic()))
        used, elapsed = cpu_s(proc.pid) - before, time.monotonic() - started
        return used / elapsed * 100, scrapes
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def main() -> int:
    fmt, size = render_ms()
    print(f"render of 8 GPUs + {RANKS} ranks ({size} bytes): {fmt:.3f} ms (median of 500)")
    node = fake_node(8)
    try:
        for g in node.scenario.gpus:
            g.util_gpu, g.power_mw, g.temperature_c = 90, 650_000, 71
        node.write()
        job = Path(tempfile.mkdtemp(prefix="podguard-bench-metrics-")) / "beats.py"
        job.write_text(JOB)
        env = node_env(node, PODGUARD_IDLE_MEMORY_MIB="0")
        base, _ = run_window(env, job, None)
        with_metrics, scrapes = run_window(env, job, free_port())
    finally:
        node.teardown()
    rows = [
        ("case", "supervisor CPU (% of a core)", "scrapes", "scrape ms (median / max)"),
        ("no metrics", f"{base:.3f}", "-", "-"),
        (
            f"--metrics-port, a scrape every {SCRAPE_EVERY_S:g} s",
            f"{with_metrics:.3f}",
            str(len(scrapes)),
            f"{statistics.median(scrapes):.2f} / {max(scrapes):.2f}",
        ),
    ]
    print(f"8 fake GPUs, {RANKS} ranks at 10 heartbeats/s, {WINDOW_S:g} s windows:")
    print(table(rows))
    print(f"the metrics' share: {with_metrics - base:+.3f} % of a core (targets: < 20 ms a scrape, < 1 % in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cluster gate latency: from the last node's verdict in the store to every node knowing it may launch.

N real processes on this host are the nodes (node 0 hosts torch's TCPStore, the others connect over
loopback), each running `run_cluster_gate` exactly as `podguard train` does after its preflight. All
nodes import torch and enter the gate first; the last node publishes its verdict a moment later, so the
figure is the gate alone, not interpreter or torch start-up. Times are wall-clock (one host, one clock):
latency = max(the gate returned, over the nodes) - max(published_at over the nodes): node 0 returns only
once the others have read the decision, so its figure includes that wait. Target: < 1 s.
The `fail` case: the last node's verdict is UNHEALTHY, and every node must know to exit.

Run: `python bench/bench_cluster_gate.py [--nodes 2 4 8] [--repeats N]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from _common import ROOT  # (also puts tests/ on sys.path)

from loopback import free_port_pair

NODE = """
import json, sys, time
from podguard import console
from podguard.launch.multinode.gate import run_cluster_gate
from podguard.launch.multinode.verdicts import NodeVerdict, gate_settings
from podguard.launch.multinode.protocol import load_store_class

rank, nnodes, port, delay, fail = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
load_store_class()  # torch imported before the clock matters
print("ready", flush=True)
sys.stdin.readline()  # go
time.sleep(delay)  # the last node reports a moment after the others are waiting
settings = gate_settings(nnodes=nnodes, node_rank=rank, addr="127.0.0.1", rdzv_port=port, cluster_port=None,
                         timeout_s=60)
sick = fail == "1" and rank == nnodes - 1
verdict = NodeVerdict(rank, "UNHEALTHY" if sick else "PASS", 76 if sick else 0,
                      ("UNHEALTHY GPU 0: bench",) if sick else ())
with console.captured():  # (the gate summary: not the benchmark's output)
    outcome = run_cluster_gate(settings, verdict)
print(json.dumps({**outcome.to_data(), "returned_at": time.time()}), flush=True)  # podguard launches (or exits) now
"""


def _delay(rank: int, nnodes: int) -> str:
    return "0.3" if rank == nnodes - 1 else "0"


def one_round(nnodes: int, fail: bool) -> float:
    """Seconds from the last verdict to the last node's decision, for one gate of `nnodes` processes."""
    port = free_port_pair()
    env_path = str(ROOT / "entrypoint")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, str(rank), str(nnodes), str(port), _delay(rank, nnodes), str(int(fail))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
            cwd=ROOT,
        )
        for rank in range(nnodes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    expected = 76 if fail else 0
    codes = [r["code"] for r in results]
    if codes != [expected] * nnodes:
        raise SystemExit(f"unexpected gate codes {codes} (wanted {expected} everywhere)")
    last_verdict = max(r["published_at"] for r in results)
    return max(r["returned_at"] for r in results) - last_verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.monotonic()
    print(f"{'case':<28} {'median':>9} {'max':>9} {'runs':>5}")
    for nnodes in args.nodes:
        for fail in (False, True):
            times = [one_round(nnodes, fail) for _ in range(args.repeats)]
            name = f"{nnodes} nodes, {'last one fails' if fail else 'all pass'}"
            print(f"{name:<28} {statistics.median(times) * 1000:>7.1f}ms {max(times) * 1000:>7.1f}ms {len(times):>5}")
    took = time.monotonic() - started
    print(f"last verdict -> every node's gate returned (launch or exit); target < 1000 ms (bench took {took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`pod up` of an Instant Cluster against the test suite's stand-in API: the requests it sends while it waits.

For one pod and for an N-node cluster (default 4) that provision, start and print PASS over the same time,
with podguard's default timings (5 s status poll), it counts the requests `pod up` sent, by kind, per
minute of waiting. Target: the cluster costs no more status requests than one pod, plus one log stream per
node (the status poll is one `GET /v2/clusters/{id}`, whatever the node count).

Run: `python bench/bench_clusters.py [--nodes N] [--wait-s S] [--runs N]`
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import PODGUARD, ROOT, compile_bytecode

sys.path.insert(0, str(ROOT / "tests" / "pods"))
from bench_pods import KEY, _env
from standin_api import Recorded, StandIn
from standin_state import Timing

SPEC = """
name = "{name}"
image = "registry.example/me/podguard:0.2"
[gpu]
types = ["NVIDIA A40"]
count = 2
{cluster}
[ready]
timeout_s = 600
"""
KINDS = (
    ("status poll", re.compile(r"^GET /v2/(pods|clusters)/[^/]+$")),
    ("log stream", re.compile(r"^GET /v2/pods/[^/]+/logs$")),
    ("member list", re.compile(r"^GET /v2/clusters/[^/]+/pods$")),
    ("lookup by name", re.compile(r"^GET /v2/(pods|clusters)$")),
    ("create", re.compile(r"^POST /v2/(pods|clusters)$")),
)


def _kind(rec: Recorded) -> str:
    line = f"{rec.method} {rec.path}"
    return next((name for name, pattern in KINDS if pattern.match(line)), "other")


def one_run(nodes: int, wait_s: float, home: Path, workdir: Path, tag: str) -> tuple[float, Counter[str]]:
    """(minutes waited, requests by kind) of one `pod up` of a pod (nodes=1) or a cluster."""
    timing = Timing(provision_s=wait_s * 0.4, start_s=wait_s * 0.1, verdict_delay_s=wait_s * 0.5)
    api = StandIn(KEY, timing).start()
    try:
        api.world.set_capacity("NVIDIA A40", 1000)
        spec = workdir / f"{tag}.toml"
        cluster = f"[cluster]\nnodes = {nodes}\n" if nodes > 1 else ""
        spec.write_text(SPEC.format(name=tag, cluster=cluster))
        started = time.monotonic()
        proc = subprocess.run(
            [*PODGUARD, "pod", "up", "--spec", str(spec)], env=_env(api, home), capture_output=True, text=True
        )
        minutes = (time.monotonic() - started) / 60
        if proc.returncode != 0:
            raise SystemExit(f"pod up failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        return minutes, Counter(_kind(r) for r in api.requests)
    finally:
        api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--wait-s", type=float, default=30.0, help="provisioning + start + preflight per node")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="podguard-bench-clusters-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        print(f"== pod up: requests while waiting ~{args.wait_s:g}s (default timings: 5 s poll), {args.runs} runs")
        for label, nodes in (("1 pod", 1), (f"{args.nodes}-node cluster", args.nodes)):
            runs = [one_run(nodes, args.wait_s, home, Path(tmp), f"b{nodes}-{i}") for i in range(args.runs)]
            total = sum((c for _, c in runs), Counter())
            rate = statistics.median(sum(c.values()) / m for m, c in runs)
            polls = statistics.median(c["status poll"] / m for m, c in runs)
            waited = statistics.median(m * 60 for m, _ in runs)
            per_run = {k: v / args.runs for k, v in sorted(total.items())}
            print(f"  {label}: waited {waited:.1f}s; {rate:.1f} requests/min in all, status polls {polls:.1f}/min")
            print("    per run: " + ", ".join(f"{k} {v:g}" for k, v in per_run.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

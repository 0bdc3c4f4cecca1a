"""Run every benchmark in bench/ one after the other (`make bench`). Figures, not pass/fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    "bench_preflight.py",
    "bench_cleanup.py",
    "bench_launch_overhead.py",
    "bench_guards.py",
    "bench_cluster_gate.py",
    "bench_logmux.py",
    "bench_pods.py",
    "bench_clusters.py",
    "bench_image.py",
    "bench_gpu_watch.py",
    "bench_stacks.py",
    "bench_watch.py",
    "bench_keep.py",
    "bench_keep_soak.py",
    "bench_false_hangs.py",
    "bench_checkpoints.py",
    "bench_metrics.py",
    "bench_store.py",
]


def main() -> int:
    failed = 0
    for name in BENCHES:
        print(f"\n=== {name}", flush=True)
        failed |= subprocess.call([sys.executable, str(HERE / name)], cwd=HERE.parent) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Launcher overhead: `podguard train --mode per-gpu -- true` on the fake 8-GPU node vs the bare `true`.

Issue #3's target: under 0.3 s of added wall time for the whole process (interpreter start-up, the full
preflight without the CUDA probe, leases, a free MASTER_PORT, 8 supervised workers, the outcome record).

Run: `python bench/bench_launch_overhead.py [--repeats N]`
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _common import PODGUARD, fake_node, interleaved, node_env, summarize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    node = fake_node(8)
    try:
        env = node_env(node)
        times = interleaved(
            {
                "bare: true": (["true"], env),
                "podguard train --mode per-gpu -- true (8)": (
                    [*PODGUARD, "train", "--mode", "per-gpu", "--", "true"],
                    env,
                ),
                "podguard run -- true": ([*PODGUARD, "run", "--", "true"], env),
            },
            args.repeats,
        )
        print(summarize(times))
        bare = statistics.median(times["bare: true"])
        for name in ("podguard train --mode per-gpu -- true (8)", "podguard run -- true"):
            added = statistics.median(times[name]) - bare
            print(f"added wall time, {name}: {added * 1000:.0f} ms (target < 300 ms)")
    finally:
        node.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

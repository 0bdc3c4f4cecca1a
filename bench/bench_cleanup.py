"""Cleanup latency: from a GPU holder's death to podguard seeing the GPU idle (and the gate passing).

Issue #2's target: under 0.5 s plus the driver's release time, with no fixed sleeps. The fake NVML can
keep a dead process's memory counted for `release_delay_ms` (the driver's release time), so both the
detection latency alone and latency with a simulated 200 ms release are measured. The seeds' script waits
a fixed `sleep 3; sleep 1; sleep 2` = 6 s whatever happens.

Also times a whole `podguard cleanup` that stops a real holder (SIGTERM honoured), as a user runs it; that
includes the quiet period (0.5 s) in which a stopped job's parent must not start a holder again before the
cleanup may report success (docs/cleanup.md, "Respawns and the quiet period").

Run: `python bench/bench_cleanup.py [--repeats N]`
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

from _common import PODGUARD, fake_node, node_env

SEED_FIXED_SLEEPS_S = 3 + 1 + 2


def death_to_idle(node, release_ms: int, repeats: int) -> list[float]:
    """Kill a holder ourselves, then time `wait_for_idle` until NVML shows GPU 0 idle."""
    from podguard.gpu.nvml import NvmlBackend
    from podguard.preflight.cleanup.executor import wait_for_idle

    node.scenario.release_delay_ms = release_ms
    node.write()
    backend = NvmlBackend(library_path=str(node.library))
    samples = []
    try:
        for _ in range(repeats):
            holder = node.spawn_holder(0, 4096)
            assert backend.processes(0), "the holder should be visible to NVML"
            died = time.perf_counter()
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            states = wait_for_idle(backend, [0], deadline=time.monotonic() + 5, dev_dir=node.dev_dir)
            samples.append(time.perf_counter() - died)
            assert states[0].idle, states[0]
    finally:
        backend.close()
    return samples


def whole_cleanup(node, repeats: int) -> list[float]:
    node.scenario.release_delay_ms = 0
    node.write()
    env = node_env(node)
    samples = []
    for _ in range(repeats):
        holder = node.spawn_holder(0, 4096)
        started = time.perf_counter()
        proc = subprocess.run([*PODGUARD, "cleanup"], env=env, capture_output=True, text=True)
        samples.append(time.perf_counter() - started)
        if proc.returncode != 0 or holder.poll() is None:
            raise SystemExit(f"cleanup failed: {proc.stderr}")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    node = fake_node(8)
    os.environ.update(node.env_vars())  # the in-process backend reads the scenario path from here
    try:
        print(f"{'measurement':<58} {'median':>9} {'max':>9}")
        for release in (0, 200):
            s = death_to_idle(node, release, args.repeats)
            label = f"holder death -> GPU idle (driver release {release} ms)"
            print(f"{label:<58} {statistics.median(s) * 1000:>7.1f}ms {max(s) * 1000:>7.1f}ms")
        s = whole_cleanup(node, max(3, args.repeats // 2))
        label = "`podguard cleanup` stopping a real holder (whole, 0.5 s quiet)"
        print(f"{label:<58} {statistics.median(s) * 1000:>7.1f}ms {max(s) * 1000:>7.1f}ms")
        print(f"{'seed script fixed sleeps (sleep 3; sleep 1; sleep 2)':<58} {SEED_FIXED_SLEEPS_S * 1000:>7.1f}ms")
        print(f"ratio: seed fixed sleeps / podguard cleanup = {SEED_FIXED_SLEEPS_S / statistics.median(s):.0f}x")
    finally:
        node.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

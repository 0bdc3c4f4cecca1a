"""The pod commands against the test suite's stand-in RunPod API (local HTTP, so the figures are podguard's own).

1. `podguard pod list --json` as a whole process vs `python -c "import runpod; ...; runpod.get_pods()"`
   (paired runs, medians, ratio).
2. Readiness latency: from the PASS line appearing in the pod's log stream to `pod up` returning
   (target < 1 s: the stream is followed, not polled).
3. Requests per minute while `pod up` waits for a pod to provision and pass (default timings).

Run: `python bench/bench_pods.py [--repeats N] [--ready-runs N] [--wait-s S]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _common import PODGUARD, ROOT, compile_bytecode, interleaved, summarize

sys.path.insert(0, str(ROOT / "tests" / "pods"))
from standin_api import StandIn
from standin_state import Timing

KEY = "rpa_BENCHKEY0123456789abcdefghijklmnop"
SPEC = """
name = "{name}"
image = "registry.example/me/podguard:0.2"
[gpu]
types = ["NVIDIA A40"]
count = 1
[ready]
timeout_s = 600
"""


def _env(api: StandIn, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODGUARD_")}
    env.update(RUNPOD_API_BASE_URL=api.url, RUNPOD_API_KEY=KEY, HOME=str(home))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def bench_list(repeats: int, home: Path) -> None:
    api = StandIn(KEY).start()
    try:
        api.world.set_capacity("NVIDIA A40", 1000)
        for i in range(20):
            api.world.create({"name": f"pod-{i}", "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 1}})
        env = _env(api, home)
        sdk = "import os, runpod; runpod.api_key = os.environ['RUNPOD_API_KEY']; assert len(runpod.get_pods()) == 20"
        times = interleaved(
            {
                "python -c 'import runpod; get_pods()'": ([sys.executable, "-c", sdk], env),
                "podguard pod list --json": ([*PODGUARD, "pod", "list", "--json"], env),
            },
            repeats,
        )
        print(summarize(times, baseline="python -c 'import runpod; get_pods()'"))
    finally:
        api.close()


def _wall(ts: str) -> float:
    """Epoch seconds of the stand-in's RFC 3339 UTC timestamps."""
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def bench_ready(runs: int, wait_s: float, home: Path, workdir: Path) -> None:
    """Fresh pods that provision for a while, then print PASS; podguard's default timings throughout."""
    api = StandIn(KEY, Timing(provision_s=wait_s * 0.4, start_s=wait_s * 0.1, verdict_delay_s=wait_s * 0.5)).start()
    latencies: list[float] = []
    rates: list[float] = []
    try:
        api.world.set_capacity("NVIDIA A40", 1000)
        env = _env(api, home)
        for i in range(runs):
            spec = workdir / f"pod-{i}.toml"
            spec.write_text(SPEC.format(name=f"ready-{i}"))
            before = len(api.requests)
            started = time.monotonic()
            proc = subprocess.run(
                [*PODGUARD, "pod", "up", "--spec", str(spec)], env=env, capture_output=True, text=True
            )
            returned = time.time()
            if proc.returncode != 0:
                raise SystemExit(f"pod up failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
            pod = next(p for p in api.world.pods.values() if p.name == f"ready-{i}")
            passed = next(e for e in pod.logs if "PASS" in e.line)
            latencies.append(returned - _wall(passed.ts))
            elapsed = time.monotonic() - started
            rates.append((len(api.requests) - before) / elapsed * 60)
    finally:
        api.close()
    print(f"readiness latency (PASS line in the log -> `pod up` returned), {runs} runs:")
    print(
        f"  median {statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms (target < 1000 ms)"
    )
    print(f"requests per minute while `pod up` waited ~{wait_s:g}s per pod (poll 5 s + one log stream):")
    print(f"  median {statistics.median(rates):.1f}/min, max {max(rates):.1f}/min")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ready-runs", type=int, default=5)
    parser.add_argument("--wait-s", type=float, default=20.0, help="provisioning + start + preflight per pod")
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="podguard-bench-pods-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        print("== pod list: whole process against the stand-in (20 pods)")
        bench_list(args.repeats, home)
        print("\n== pod up: readiness latency and request rate")
        bench_ready(args.ready_runs, args.wait_s, home, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

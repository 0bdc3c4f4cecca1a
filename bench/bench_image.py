"""The image's start-up: `docker run` -> the first line of the training command, and the preflight's share.

Cases, interleaved (each round runs every case once), all as `docker run --rm` from the docker CLI:
  bare           the image running `python3 -c print(...)` directly: container start + Python, no podguard
  train, CPU     `train --mode single -- python3 -c print(...)`: podguard, its preflight (no GPU), the launch
  train, 8 GPUs  the same with the tests' fake 8xH100 node mounted where the NVIDIA toolkit puts the driver
For each: seconds from calling `docker run` to the preflight summary line and to the job's first line, and
the preflight's own duration as its summary line reports it.

Run: `python bench/bench_image.py [--image podguard:latest] [--repeats 5]` (the image must exist: `make image`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

from _common import ROOT, fake_node

sys.path.insert(0, str(ROOT / "tests" / "image"))
from imagetools import fake_gpu_args

FIRST = "FIRST LINE"
JOB = ["python3", "-c", f"print({FIRST!r}, flush=True)"]
_SUMMARY = re.compile(r"^podguard train: (\w+) .* in (\d+) ms")


def one_run(image: str, opts: list[str], args: list[str]) -> dict[str, float]:
    """Times (s) from `docker run` to the summary line and to the first job line; the preflight's ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["docker", "run", "--rm", *opts, image, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out: dict[str, float] = {}
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - start
        lines.append(line)
        match = _SUMMARY.match(line)
        if match:
            if match.group(1) != "PASS":
                raise SystemExit(f"preflight did not pass: {line.strip()}")
            out["summary_s"], out["preflight_ms"] = now, float(match.group(2))
        if line.strip() == FIRST and "first_s" not in out:
            out["first_s"] = now
    if proc.wait() != 0 or "first_s" not in out:
        tail = "".join(lines[-15:])
        raise SystemExit(f"docker run {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="podguard:latest")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        found = subprocess.run(["docker", "image", "inspect", args.image], capture_output=True).returncode == 0
    except FileNotFoundError:
        found = False
    if not found:
        print(f"SKIPPED: image {args.image} not found or no Docker engine (make image, or run the image tests)")
        return 0
    node = fake_node(8)
    try:
        gpu = [*fake_gpu_args(node), "-e", "PODGUARD_PROBE=off"]
        train = ["train", "--mode", "single", "--", *JOB]
        cases = {"bare (no podguard)": ([], JOB), "train, CPU": ([], train), "train, 8 fake GPUs": (gpu, train)}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        one_run(args.image, [], JOB)  # warm the page cache: the first container start reads the image
        for _ in range(args.repeats):
            for name, (opts, argv) in cases.items():
                results[name].append(one_run(args.image, opts, argv))
    finally:
        node.teardown()
    print(f"image {args.image}, {args.repeats} runs per case (medians; docker run called at 0)")
    print(f"{'case':<22} {'-> summary':>11} {'-> 1st job line':>16} {'preflight':>10} {'share':>7}")
    for name, runs in results.items():
        first = statistics.median(r["first_s"] for r in runs)
        if "summary_s" not in runs[0]:
            print(f"{name:<22} {'-':>11} {first:>15.2f}s {'-':>10} {'-':>7}")
            continue
        summary = statistics.median(r["summary_s"] for r in runs)
        pre = statistics.median(r["preflight_ms"] for r in runs)
        print(f"{name:<22} {summary:>10.2f}s {first:>15.2f}s {pre:>8.0f}ms {pre / 1000 / first:>6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

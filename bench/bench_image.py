"""The image's size over its base and its start-up: `docker run` -> the first line of the training command.

Layers: the bytes each image adds over its base (`docker history` of the image minus its base's; the base is
the image's `org.opencontainers.image.base.name` label), for the default build (podguard's own Python
environment and torch) and for `--torch base` (the base's Python and torch; docs/image.md's budget: 30 MB).

Start-up, for each image: cases interleaved (each round runs every case once), all as `docker run --rm`:
  bare           the image running `python3 -c print(...)` directly: container start + Python, no podguard
  train, CPU     `train --mode single -- python3 -c print(...)`: podguard, its preflight (no GPU), the launch
  train, 8 GPUs  the same with the tests' fake 8xH100 node mounted where the NVIDIA toolkit puts the driver
  demo, CPU      `train`: the built-in demo; its first line comes after `import torch` (2 gloo workers)
For each: seconds from calling `docker run` to the preflight summary line and to the job's first line, and
the preflight's own duration as its summary line reports it.

Run: `python bench/bench_image.py [--image podguard:latest] [--torch-base-image podguard-torchbase:latest]
[--repeats 5]`; an image that does not exist is skipped with a line. On the CI machines (no registry), build
them on the tests' bases first:
  podguard image build --base podguard-test-base:bookworm --torch torch==2.13.0 --tag podguard:latest
  podguard image build --base podguard-test-torchbase:bookworm --torch base --tag podguard-torchbase:latest
(the bases: tests/image/support/build-base-image.sh, then build-torch-base.sh).
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
# The demo's first line comes after `import torch` (the base's torch, for a --torch base image).
_DEMO_FIRST = re.compile(r"^\S*\[demo\]")
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
        if (line.strip() == FIRST or _DEMO_FIRST.match(line)) and "first_s" not in out:
            out["first_s"] = now
    if proc.wait() != 0 or "first_s" not in out:
        tail = "".join(lines[-15:])
        raise SystemExit(f"docker run {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    return out


def exists(image: str) -> bool:
    try:
        return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def added_over_base(image: str) -> tuple[str, int, int] | None:
    """(base, bytes the image adds over it, the image's bytes); None when the base is not on this host."""
    label = '{{ index .Config.Labels "org.opencontainers.image.base.name" }}'
    base = subprocess.run(["docker", "image", "inspect", "-f", label, image], capture_output=True, text=True)
    name = base.stdout.strip()
    if not name or not exists(name):
        return None
    fmt = ["--human=false", "--format", "{{.Size}}"]
    mine = subprocess.run(["docker", "history", *fmt, image], capture_output=True, text=True, check=True).stdout
    theirs = subprocess.run(["docker", "history", *fmt, name], capture_output=True, text=True, check=True).stdout
    sizes = [int(x) for x in mine.split()]
    ours = sizes[: len(sizes) - len(theirs.split())]
    return name, sum(ours), sum(sizes)


def startup(image: str, repeats: int, node_args: list[str]) -> dict[str, list[dict[str, float]]]:
    gpu = [*node_args, "-e", "PODGUARD_PROBE=off"]
    train = ["train", "--mode", "single", "--", *JOB]
    cases = {
        "bare (no podguard)": ([], JOB),
        "train, CPU": ([], train),
        "train, 8 fake GPUs": (gpu, train),
        "demo (torch), CPU": ([], ["train"]),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    one_run(image, [], JOB)  # warm the page cache: the first container start reads the image
    for _ in range(repeats):
        for name, (opts, argv) in cases.items():
            results[name].append(one_run(image, opts, argv))
    return results


def print_startup(image: str, repeats: int, results: dict[str, list[dict[str, float]]]) -> None:
    print(f"\nimage {image}, {repeats} runs per case (medians; docker run called at 0)")
    print(f"{'case':<22} {'-> summary':>11} {'-> 1st job line':>16} {'preflight':>10} {'share':>7}")
    for name, runs in results.items():
        first = statistics.median(r["first_s"] for r in runs)
        if "summary_s" not in runs[0]:
            print(f"{name:<22} {'-':>11} {first:>15.2f}s {'-':>10} {'-':>7}")
            continue
        summary = statistics.median(r["summary_s"] for r in runs)
        pre = statistics.median(r["preflight_ms"] for r in runs)
        print(f"{name:<22} {summary:>10.2f}s {first:>15.2f}s {pre:>8.0f}ms {pre / 1000 / first:>6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="podguard:latest", help="a default build")
    parser.add_argument("--torch-base-image", default="podguard-torchbase:latest", help="a --torch base build")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    images = {"default": args.image, "--torch base": args.torch_base_image}
    found = {kind: image for kind, image in images.items() if exists(image)}
    for kind, image in images.items():
        if kind not in found:
            print(f"SKIPPED {kind}: image {image} not found or no Docker engine (see this file's docstring)")
    if not found:
        return 0
    print(f"{'build':<13} {'image':<30} {'over its base':>14} {'image size':>11}  base")
    for kind, image in found.items():
        added = added_over_base(image)
        if added is None:
            print(f"{kind:<13} {image:<30} {'(base not here)':>14}")
            continue
        base, over, total = added
        print(f"{kind:<13} {image:<30} {over / 1e6:>11.1f} MB {total / 1e6:>8.0f} MB  {base}")
    node = fake_node(8)
    try:
        for image in found.values():
            print_startup(image, args.repeats, startup(image, args.repeats, fake_gpu_args(node)))
    finally:
        node.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

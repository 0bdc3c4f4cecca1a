"""What finding the checkpoint to resume from costs, and how much work a `--save-signal` saves (issue 25).

    python bench/bench_checkpoints.py [--quick]

1. The finder on 1,000 Hugging Face `checkpoint-<N>/` folders, each with a 100 MB `model.safetensors` (sparse:
   a real header, then a hole) and a `trainer_state.json`: 100 GB in all. Median of 5 `find_checkpoints` calls
   (page cache warm, as on a restart), and the bytes the process read for one call (/proc/self/io); then what a
   restart and a save-wait poll cost (judging newest first until the first whole one / only what is new).
2. One 2 GB safetensors file (sparse): judged from its header alone (time and bytes read), whole and cut short.
3. Work lost when `--max-runtime` ends the demo job (2 gloo ranks, `--save-every 500`), with and without
   `--save-signal USR1`: the steps the next run redoes = the last step done - the step it resumes from.
   `--quick` skips it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PODGUARD, ROOT, fake_node, node_env

sys.path.insert(0, str(ROOT / "entrypoint"))

from podguard.checkpoints import find_checkpoints
from podguard.checkpoints.files import safetensors_why

CHECKPOINTS = 1000
EACH = 100 * 1000 * 1000  # bytes per model.safetensors (sparse)


def sparse_safetensors(path: Path, total: int) -> None:
    """A valid safetensors file of `total` bytes: one uint8 tensor filling the data, written as a hole."""
    n_guess = 128
    data = total - 8 - n_guess
    header = json.dumps({"w": {"dtype": "U8", "shape": [data], "data_offsets": [0, data]}}).encode()
    header = header.ljust(n_guess, b" ")  # the spec allows trailing spaces in the header
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(total)


def _rchar() -> int:
    with open("/proc/self/io", "rb", buffering=0) as f:
        return int(f.read().split(b"rchar:")[1].split()[0])


_first = _rchar()
PROBE_COST = _rchar() - _first  # what reading /proc/self/io itself adds to rchar


def read_bytes() -> int:
    """Bytes this process has read so far (rchar), less the cost of asking."""
    return _rchar() - PROBE_COST


def finder(root: Path) -> None:
    for step in range(1, CHECKPOINTS + 1):
        folder = root / f"checkpoint-{step * 10}"
        folder.mkdir()
        sparse_safetensors(folder / "model.safetensors", EACH)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step * 10}))
    logical = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    on_disk = sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        finding = find_checkpoints(root)
        times.append(time.perf_counter() - t0)
    before = read_bytes()
    finding = find_checkpoints(root)
    got = read_bytes() - before
    assert finding.chosen is not None and finding.chosen.step == CHECKPOINTS * 10 and len(finding.checkpoints) == 1000
    size = f"{logical / 1e9:.0f} GB logical ({on_disk / 1e6:.0f} MB on disk)"
    print(f"1. finder: {len(finding.checkpoints)} checkpoints, {size}")
    print(f"   find_checkpoints: median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")
    print(f"   read per call: {got / 1000:.0f} KB ({got / len(finding.checkpoints):.0f} B per checkpoint)")
    for what, kwargs in (
        ("before an attempt (until_whole)", {"until_whole": True}),
        ("a save-wait poll (only the new)", {"until_whole": True, "skip": finding.keys}),
    ):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            find_checkpoints(root, **kwargs)
            times.append(time.perf_counter() - t0)
        print(f"   {what}: median {statistics.median(times) * 1000:.0f} ms")


def big_file(root: Path) -> None:
    path = root / "model-2gb.safetensors"
    sparse_safetensors(path, 2 * 1000**3)
    before = read_bytes()
    t0 = time.perf_counter()
    why = safetensors_why(str(path))
    took = time.perf_counter() - t0
    got = read_bytes() - before
    print(f"2. 2 GB safetensors: whole={why == ''} in {took * 1e6:.0f} us, {got} bytes read")
    with open(path, "r+b") as f:
        f.truncate(1_200_000_000)
    t0 = time.perf_counter()
    why = safetensors_why(str(path))
    print(f"   cut to 1.2 GB: {why!r} in {(time.perf_counter() - t0) * 1e6:.0f} us")


DEMO = ["-m", "podguard.demo", "--preset", "ci", "--steps", "100000000", "--save-every", "500", "--log-every", "1"]


def lost_steps(env: dict[str, str], root: Path, save_signal: bool, runtime_s: float) -> tuple[int, int, str]:
    """(last step done, step the next run resumes from, the guard's line) for one --max-runtime stop."""
    ckpt = root / ("with" if save_signal else "without")
    args = [
        "train",
        "--mode",
        "per-gpu",
        "--cpu-workers",
        "2",
        "--checkpoints",
        str(ckpt),
        "--max-runtime",
        f"{runtime_s}s",
    ]
    if save_signal:
        args += ["--save-signal", "USR1"]
    proc = subprocess.run(
        [*PODGUARD, *args, "--", sys.executable, *DEMO], env=env, capture_output=True, text=True, timeout=300
    )
    text = proc.stdout + proc.stderr
    if proc.returncode != 124:
        raise SystemExit(f"expected 124, got {proc.returncode}:\n{text[-3000:]}")
    done = max(int(m) for m in re.findall(r"\[rank 0\] step (\d+)/", text))
    resumed = find_checkpoints(ckpt).chosen
    if resumed is not None and resumed.step is not None:
        done = max(done, resumed.step)  # (the step saved on the signal stops the loop before its progress line)
    guard = next(ln for ln in text.splitlines() if "not inside a RunPod pod" in ln)
    return done, resumed.step if resumed is not None and resumed.step is not None else 0, guard


def main() -> None:
    quick = "--quick" in sys.argv
    root = Path(tempfile.mkdtemp(prefix="podguard-bench-ckpt-"))
    try:
        (root / "many").mkdir()
        finder(root / "many")
        big_file(root)
        if quick:
            return
        node = fake_node()
        try:
            env = node_env(node, LD_LIBRARY_PATH="")
            print("3. work lost on a --max-runtime stop (demo job, 2 gloo ranks, --save-every 500):")
            for save in (False, True):
                done, resumed, guard = lost_steps(env, root, save, 12.0)
                label = "with --save-signal USR1" if save else "without --save-signal  "
                print(f"   {label}: last step {done}, the next run resumes at {resumed}: {done - resumed} steps redone")
                print(f"      {guard.removeprefix('podguard: ')}")
        finally:
            node.teardown()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.pop("PODGUARD_RESUME_FROM", None)
    main()

"""Shared helpers for the benchmarks: a fake 8-GPU node (the test suite's fake libnvidia-ml.so.1), timing
of whole processes, and a small table printer. Benchmarks report figures; they are not pass/fail tests."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenvml.build import build_fake_nvml  # noqa: E402
from fakenvml.node import NvmlNode  # noqa: E402
from fakenvml.scenario import healthy_h100  # noqa: E402

PODGUARD = [sys.executable, "-m", "podguard"]


def fake_node(count: int = 8) -> NvmlNode:
    """A healthy fake node in a fresh temp dir; call `.teardown()` when done."""
    root = Path(tempfile.mkdtemp(prefix="podguard-bench-"))
    lib_dir = build_fake_nvml(ROOT / "build" / "fakenvml")
    node = NvmlNode(root=root / "node", lib_dir=lib_dir, scenario=healthy_h100(count))
    node.write()
    compile_bytecode()
    return node


def compile_bytecode() -> None:
    """A real install (`pip install .`, the image) ships compiled bytecode; an editable checkout under
    PYTHONDONTWRITEBYTECODE=1 recompiles every module on every start. Measure what users run."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "entrypoint")], check=True)


def node_env(node: NvmlNode, **extra: str) -> dict[str, str]:
    env = {**node.env, "PODGUARD_PROBE": "off", "PODGUARD_STATE_DIR": str(node.root / "state")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for var in ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT"):
        env.pop(var, None)
    env.update(extra)
    return env


def time_process(argv: Sequence[str], env: dict[str, str]) -> float:
    """Wall seconds of one whole process (interpreter start-up included), which must exit 0."""
    started = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return elapsed


def interleaved(cases: dict[str, tuple[Sequence[str], dict[str, str]]], repeats: int) -> dict[str, list[float]]:
    """Run every case once per round, rounds interleaved, so machine noise hits all cases alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (argv, env) in cases.items():
            times[name].append(time_process(argv, env))
    return times


def summarize(times: dict[str, list[float]], baseline: str | None = None) -> str:
    lines = [f"{'case':<44} {'median':>9} {'min':>9} {'runs':>5}" + ("   ratio vs " + baseline if baseline else "")]
    base = statistics.median(times[baseline]) if baseline else None
    for name, values in times.items():
        med = statistics.median(values)
        row = f"{name:<44} {med * 1000:>7.1f}ms {min(values) * 1000:>7.1f}ms {len(values):>5}"
        if base is not None and name != baseline:
            row += f"   {base / med:>6.1f}x faster"
        lines.append(row)
    return "\n".join(lines)


def cpu_count() -> int:
    return os.cpu_count() or 1

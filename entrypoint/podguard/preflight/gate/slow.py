"""Slow GPUs: a probe metric far below the node's other GPUs, or below a known floor for the GPU's model.

    slow_findings({0: {"matmul_tflops": 790.0}, 1: {"matmul_tflops": 510.0}, 2: {"matmul_tflops": 785.0}},
                  {0: "NVIDIA H200", 1: "NVIDIA H200", 2: "NVIDIA H200"}, ratio=0.8)
    # {1: [Degraded(code="slow", text="matmul_tflops 510 TFLOP/s is below 0.8 x the median ...", ...)]}

Two checks (PRODUCT.md "Degraded GPUs"): relative, a metric below `ratio` x the median of the GPUs that
report it (two or more); absolute, a metric below the floor of its model (FLOORS, matched on NVML's name),
so eight equally slow GPUs are caught too. Unknown models get the relative check only. Only the probe
metrics of METRICS are judged (all higher-is-better); other keys a user's probe prints are left alone.
`allreduce_busbw_gbps` is node-level: it arrives as the same value for every GPU, has no relative check
(a median of equal values says nothing), and its floor applies to every GPU of the node. The floors and
their sources: docs/gate.md ("Slow GPUs").
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from podguard.preflight.gate.degraded import Degraded

__all__ = ["FLOORS", "METRICS", "NODE_METRICS", "ModelFloors", "model_floors", "slow_findings"]

METRICS: dict[str, str] = {  # metric -> unit
    "matmul_tflops": "TFLOP/s",
    "mem_gbps": "GB/s",
    "h2d_gbps": "GB/s",
    "allreduce_busbw_gbps": "GB/s",
}
NODE_METRICS = frozenset({"allreduce_busbw_gbps"})


@dataclass(frozen=True)
class ModelFloors:
    """Conservative minimums for one GPU model; a metric it lacks has no floor."""

    model: str  # the table's short name ("H100 SXM")
    pattern: str  # regex searched in NVML's name, lower-cased, "nvidia " dropped
    floors: Mapping[str, float]


def _floors(model: str, pattern: str, matmul: float, mem: float, h2d: float, busbw: float | None = None) -> ModelFloors:
    floors = {"matmul_tflops": matmul, "mem_gbps": mem, "h2d_gbps": h2d}
    if busbw is not None:
        floors["allreduce_busbw_gbps"] = busbw
    return ModelFloors(model, pattern, floors)


# First match wins: the more specific names (NVL, PCIe, 80GB) come before the general ones. Sources and the
# rule behind each number (about 50 % of the dense bf16 peak, 60 % of the memory bandwidth, half of a
# cloud's per-GPU host-copy threshold, two thirds of a cloud's all-reduce threshold): docs/gate.md.
FLOORS: tuple[ModelFloors, ...] = (
    _floors("H200 NVL", r"\bh200 nvl\b", 400, 2900, 24),
    _floors("H200", r"\bh200\b", 480, 2900, 24, 300),
    _floors("H100 NVL", r"\bh100 nvl\b", 400, 2300, 24),
    _floors("H100 PCIe", r"\bh100\b.*\bpcie\b", 360, 1200, 24),
    _floors("H100 SXM", r"\bh100\b.*\b(sxm\w*|hbm3\w*)\b", 480, 2000, 24, 300),
    _floors("A100 SXM 80GB", r"\ba100\b.*\bsxm\w*\b.*\b80gb\b", 150, 1200, 12, 150),
    _floors("A100 SXM 40GB", r"\ba100\b.*\bsxm\w*\b", 150, 930, 12, 150),
    _floors("A100 PCIe 80GB", r"\ba100\b.*(\b80gb\b.*\bpcie\b|\bpcie\b.*\b80gb\b)", 150, 1150, 12),
    _floors("A100 PCIe 40GB", r"\ba100\b.*\bpcie\b", 150, 930, 12),
    _floors("L40S", r"\bl40s\b", 170, 500, 12),
    _floors("L40", r"\bl40\b", 85, 500, 12),
    _floors("RTX 4090", r"\brtx 4090\b(?!.*\blaptop\b)", 80, 600, 12),
    _floors("RTX A6000", r"\brtx a6000\b", 75, 460, 12),
    _floors("A40", r"^a40\b", 70, 420, 12),
)


def model_floors(name: str) -> ModelFloors | None:
    """The floors for NVML's model name ("NVIDIA H100 80GB HBM3"), or None for a model not in the table."""
    key = " ".join(name.lower().split()).removeprefix("nvidia ")
    return next((entry for entry in FLOORS if re.search(entry.pattern, key)), None)


def slow_findings(
    metrics: Mapping[int, Mapping[str, float]], models: Mapping[int, str], ratio: float
) -> dict[int, list[Degraded]]:
    """Slow-GPU findings per GPU index (only GPUs with findings appear), in index order.

    metrics: the probe's metrics per GPU; models: NVML's name per GPU (missing: no floors); ratio:
    PODGUARD_SLOW_RATIO, 0 < ratio <= 1 (0 turns the relative check off)."""
    if not (isinstance(ratio, int | float) and 0 <= ratio <= 1):
        raise ValueError(f"slow ratio {ratio!r} is not valid; expected a number from 0 to 1")
    values = {index: _measured(per_gpu) for index, per_gpu in metrics.items()}
    found: dict[int, list[Degraded]] = {}
    for metric in METRICS:
        if metric not in NODE_METRICS:
            for index, finding in _relative(metric, values, ratio):
                found.setdefault(index, []).append(finding)
        for index, finding in _below_floor(metric, values, models):
            found.setdefault(index, []).append(finding)
    return {index: found[index] for index in sorted(found)}


def _measured(per_gpu: Mapping[str, float]) -> dict[str, float]:
    """The judged metrics that are real measurements (finite, not negative); anything else is left out."""
    out: dict[str, float] = {}
    for key, value in per_gpu.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key in METRICS and number and math.isfinite(value) and value >= 0:
            out[key] = float(value)
    return out


def _relative(metric: str, values: Mapping[int, Mapping[str, float]], ratio: float) -> list[tuple[int, Degraded]]:
    have = {index: per_gpu[metric] for index, per_gpu in values.items() if metric in per_gpu}
    if len(have) < 2:
        return []
    median = statistics.median(have.values())
    threshold = ratio * median
    unit = METRICS[metric]
    return [
        (
            index,
            Degraded(
                code="slow",
                text=(
                    f"{metric} {_num(value)} {unit} is below {ratio:g} x the median of {len(have)} GPUs "
                    f"({_num(median)} {unit})"
                ),
                values={
                    "metric": metric,
                    "value": value,
                    "median": median,
                    "ratio": ratio,
                    "threshold": threshold,
                    "gpus": len(have),
                },
            ),
        )
        for index, value in sorted(have.items())
        if value < threshold
    ]


def _below_floor(
    metric: str, values: Mapping[int, Mapping[str, float]], models: Mapping[int, str]
) -> list[tuple[int, Degraded]]:
    out: list[tuple[int, Degraded]] = []
    unit = METRICS[metric]
    for index in sorted(values):
        value = values[index].get(metric)
        entry = model_floors(models.get(index, ""))
        floor = entry.floors.get(metric) if entry else None
        if value is None or entry is None or floor is None or value >= floor:
            continue
        what = " (the node's all-reduce bus bandwidth)" if metric in NODE_METRICS else ""
        text = f"{metric} {_num(value)} {unit}{what} is below the floor {_num(floor)} {unit} for {entry.model} GPUs"
        out.append(
            (
                index,
                Degraded(
                    code="slow",
                    text=text,
                    values={"metric": metric, "value": value, "floor": floor, "model": entry.model},
                ),
            )
        )
    return out


def _num(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"

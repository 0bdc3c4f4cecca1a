"""Slow GPUs: a probe metric far below the node's other GPUs of its model, or below a floor that holds on every host.

    slow_findings({0: {"matmul_tflops": 790.0}, 1: {"matmul_tflops": 510.0}, 2: {"matmul_tflops": 785.0}},
                  {0: "NVIDIA H200", 1: "NVIDIA H200", 2: "NVIDIA H200"}, ratio=0.8,
                  links={0: (5, 16), 1: (5, 16), 2: (5, 16)})
    # {1: [Degraded(code="slow", text="matmul_tflops 510 TFLOP/s is below 0.8 x the median ...", ...)]}

Two checks (docs/gate.md, "Slow GPUs"): relative, a metric below `ratio` x the median of the GPUs of the same
model (and MIG profile) that report it, two or more (`ratio` 0 turns it off); absolute, a metric below a floor,
so eight equally slow GPUs are caught too. `matmul_tflops`, `mem_gbps` and `allreduce_busbw_gbps` have per-model
floors (FLOORS, matched on NVML's name); `h2d_gbps` depends on the host's PCIe link, not on the card, so its floor
follows the link generation and width maximum NVML reports (`h2d_floor`), and it has no relative check (the host's
path, not the GPU, sets it: FLOOR_ONLY_METRICS). A MIG slice is never held to a whole
GPU's floors, and is compared only with slices of its own profile. Only the metrics of METRICS are judged (all
higher-is-better); other keys a user's probe prints are left alone. `allreduce_busbw_gbps` is node-level: the same
value for every GPU, no relative check, and its floor applies to every GPU of the node. The floors and their
sources: docs/gate.md ("Slow GPUs").
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from podguard.preflight.gate.degraded import Degraded

__all__ = [
    "FLOORS",
    "FLOOR_ONLY_METRICS",
    "H2D_LINK_FRACTION",
    "METRICS",
    "NODE_METRICS",
    "PCIE_LANE_GBPS",
    "ModelFloors",
    "h2d_floor",
    "model_floors",
    "slow_findings",
]

METRICS: dict[str, str] = {  # metric -> unit
    "matmul_tflops": "TFLOP/s",
    "mem_gbps": "GB/s",
    "h2d_gbps": "GB/s",
    "allreduce_busbw_gbps": "GB/s",
}
NODE_METRICS = frozenset({"allreduce_busbw_gbps"})
# Metrics judged only against their floor, never against the other GPUs: a host-to-device copy measures the host's
# path (the link it gives the card, a switch uplink, which NUMA node the probe's pinned buffer landed on), not the
# GPU. docs/gate.md ("Slow GPUs").
FLOOR_ONLY_METRICS = frozenset({"h2d_gbps"})


@dataclass(frozen=True)
class ModelFloors:
    """Conservative minimums for one GPU model; a metric it lacks has no floor."""

    model: str  # the table's short name ("H100 SXM")
    pattern: str  # regex searched in NVML's name, lower-cased, "nvidia " dropped
    floors: Mapping[str, float]


def _floors(model: str, pattern: str, matmul: float, mem: float, busbw: float | None = None) -> ModelFloors:
    floors = {"matmul_tflops": matmul, "mem_gbps": mem}
    if busbw is not None:
        floors["allreduce_busbw_gbps"] = busbw
    return ModelFloors(model, pattern, floors)


# First match wins: the more specific names (NVL, PCIe, 80GB) come before the general ones. Sources and the
# rule behind each number (about 50 % of the dense bf16 peak, 60 % of the memory bandwidth, two thirds of a
# cloud's all-reduce threshold): docs/gate.md.
FLOORS: tuple[ModelFloors, ...] = (
    _floors("H200 NVL", r"\bh200 nvl\b", 400, 2900),
    _floors("H200", r"\bh200\b", 480, 2900, 300),
    _floors("H100 NVL", r"\bh100 nvl\b", 400, 2300),
    _floors("H100 PCIe", r"\bh100\b.*\bpcie\b", 360, 1200),
    _floors("H100 SXM", r"\bh100\b.*\b(sxm\w*|hbm3\w*)\b", 480, 2000, 300),
    _floors("A100 SXM 80GB", r"\ba100\b.*\bsxm\w*\b.*\b80gb\b", 150, 1200, 150),
    _floors("A100 SXM 40GB", r"\ba100\b.*\bsxm\w*\b", 150, 930, 150),
    _floors("A100 PCIe 80GB", r"\ba100\b.*(\b80gb\b.*\bpcie\b|\bpcie\b.*\b80gb\b)", 150, 1150),
    _floors("A100 PCIe 40GB", r"\ba100\b.*\bpcie\b", 150, 930),
    _floors("L40S", r"\bl40s\b", 170, 500),
    _floors("L40", r"\bl40\b", 85, 500),
    _floors("RTX 4090", r"\brtx 4090\b(?!.*\blaptop\b)", 80, 600),
    _floors("RTX A6000", r"\brtx a6000\b", 75, 460),
    _floors("A40", r"^a40\b", 70, 420),
)

# Usable PCIe bandwidth per lane and direction, GB/s, by link generation: the transfer rate (2.5, 5, 8, 16, 32,
# 64 GT/s) less the line code (8b/10b for gen 1-2, 128b/130b for gen 3-5, 242/256 FLIT for gen 6), in bytes.
PCIE_LANE_GBPS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# The h2d floor as a fraction of that link: half of the operators' pass mark (Azure's 48 GB/s on Gen5 x16 and
# 24 GB/s on Gen4 x16 are 76 % of the link), so a healthy Gen4 host (22-26 GB/s) passes with twice the margin.
H2D_LINK_FRACTION = 0.38


def model_floors(name: str) -> ModelFloors | None:
    """The floors for NVML's model name ("NVIDIA H100 80GB HBM3"), or None for a model not in the table."""
    key = " ".join(name.lower().split()).removeprefix("nvidia ")
    return next((entry for entry in FLOORS if re.search(entry.pattern, key)), None)


def h2d_floor(gen_max: int | None, width_max: int | None) -> float | None:
    """The host-to-device copy floor, GB/s, for a link of this generation and width maximum (NVML's "possible
    with this device and system"), or None when NVML did not say."""
    lane = PCIE_LANE_GBPS.get(gen_max) if isinstance(gen_max, int) and not isinstance(gen_max, bool) else None
    if lane is None or not isinstance(width_max, int) or isinstance(width_max, bool) or width_max <= 0:
        return None
    return round(H2D_LINK_FRACTION * lane * width_max, 1)


def slow_findings(
    metrics: Mapping[int, Mapping[str, float]],
    models: Mapping[int, str],
    ratio: float,
    *,
    links: Mapping[int, tuple[int | None, int | None]] | None = None,
    mig: Mapping[int, str] | None = None,
) -> dict[int, list[Degraded]]:
    """Slow-GPU findings per GPU index (only GPUs with findings appear), in index order.

    metrics: the probe's metrics per GPU; models: NVML's name per GPU (missing: no model floors); ratio:
    PODGUARD_SLOW_RATIO, 0 <= ratio <= 1 (0 turns the relative check off); links: the PCIe (generation, width)
    maxima per GPU (missing: no h2d floor); mig: the MIG profile of the slice a GPU was measured on (no floors;
    compared only with slices of the same profile)."""
    if not (isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 <= ratio <= 1):
        raise ValueError(f"slow ratio {ratio!r} is not valid; expected a number from 0 to 1")
    values = {index: _measured(per_gpu) for index, per_gpu in metrics.items()}
    mig = mig or {}
    groups = {index: (models.get(index, ""), mig.get(index)) for index in values}
    found: dict[int, list[Degraded]] = {}
    for metric in METRICS:
        if metric not in NODE_METRICS and metric not in FLOOR_ONLY_METRICS and ratio > 0:
            for index, finding in _relative(metric, values, groups, ratio):
                found.setdefault(index, []).append(finding)
        whole = {index: per_gpu for index, per_gpu in values.items() if index not in mig}
        for index, finding in _below_floor(metric, whole, models, links or {}):
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


def _relative(
    metric: str,
    values: Mapping[int, Mapping[str, float]],
    groups: Mapping[int, tuple[str, str | None]],
    ratio: float,
) -> list[tuple[int, Degraded]]:
    """Each GPU against the median of the GPUs of its group (same model, same MIG profile) with this metric."""
    members: dict[tuple[str, str | None], dict[int, float]] = {}
    for index, per_gpu in values.items():
        if metric in per_gpu:
            members.setdefault(groups[index], {})[index] = per_gpu[metric]
    unit = METRICS[metric]
    out: list[tuple[int, Degraded]] = []
    for have in members.values():
        if len(have) < 2:
            continue
        median = statistics.median(have.values())
        threshold = ratio * median
        for index, value in have.items():
            if value < threshold:
                text = (
                    f"{metric} {_num(value)} {unit} is below {ratio:g} x the median of {len(have)} GPUs "
                    f"({_num(median)} {unit})"
                )
                numbers = {
                    "metric": metric,
                    "value": value,
                    "median": median,
                    "ratio": ratio,
                    "threshold": threshold,
                    "gpus": len(have),
                }
                out.append((index, Degraded(code="slow", text=text, values=numbers)))
    return sorted(out, key=lambda item: item[0])


def _floor(
    metric: str, model: str, link: tuple[int | None, int | None] | None
) -> tuple[float, str, dict[str, int | str]] | None:
    """(floor, what it is for, the values that name it) of one metric on one GPU, or None when there is none."""
    if metric == "h2d_gbps":
        gen, width = link or (None, None)
        floor = h2d_floor(gen, width)
        if floor is None:  # (NVML gave no generation or width: no copy floor)
            return None
        return floor, f"a PCIe gen {gen} x{width} host link", {"pcie_gen_max": gen, "pcie_width_max": width}
    entry = model_floors(model)
    floor = entry.floors.get(metric) if entry else None
    if entry is None or floor is None:
        return None
    return floor, f"{entry.model} GPUs", {"model": entry.model}


def _below_floor(
    metric: str,
    values: Mapping[int, Mapping[str, float]],
    models: Mapping[int, str],
    links: Mapping[int, tuple[int | None, int | None]],
) -> list[tuple[int, Degraded]]:
    out: list[tuple[int, Degraded]] = []
    unit = METRICS[metric]
    for index in sorted(values):
        value = values[index].get(metric)
        judged = _floor(metric, models.get(index, ""), links.get(index))
        if value is None or judged is None or value >= judged[0]:
            continue
        floor, what_for, names = judged
        node = " (the node's all-reduce bus bandwidth)" if metric in NODE_METRICS else ""
        text = f"{metric} {_num(value)} {unit}{node} is below the floor {_num(floor)} {unit} for {what_for}"
        numbers: dict[str, float | int | str] = {"metric": metric, "value": value, "floor": floor}
        numbers.update(names)
        out.append((index, Degraded(code="slow", text=text, values=numbers)))
    return out


def _num(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"

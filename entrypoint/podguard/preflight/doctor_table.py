"""`podguard doctor`'s GPU table: one row per GPU a person reads at a glance, the reason next to a degraded one.

    print("\\n".join(gpu_table(data["gpus"], data["health"], data["metrics"])))

    GPU  verdict    temp    pcie         nvlink  clocks  TFLOPS  mem GB/s  h2d GB/s  busbw GB/s  why
      0  healthy    33/87C  x16/16 g5/5  18/18   idle       700      2950      53.1         465
      3  unhealthy  33/87C  x8/16 g5/5   18/18   idle         -         -         -           -  degraded: PCIe x8
    (the name column is left out here)

Metrics come from the last preflight that probed (doctor itself never starts a CUDA context).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["gpu_table"]

METRIC_COLUMNS = (("matmul_tflops", "TFLOPS"), ("mem_gbps", "mem GB/s"), ("h2d_gbps", "h2d GB/s"))
BUSBW = ("allreduce_busbw_gbps", "busbw GB/s")


def _num(value: object) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _pair(a: object, b: object, unit: str = "") -> str:
    return "n/a" if a is None else f"{a}/{'n/a' if b is None else b}{unit}"


def _pcie(gpu: Mapping[str, Any]) -> str:
    width = f"x{_pair(gpu.get('pcie_link_width'), gpu.get('pcie_link_width_max'))}"
    gen = gpu.get("pcie_link_gen")
    return width if gen is None else f"{width} g{_pair(gen, gpu.get('pcie_link_gen_max'))}"


def _clocks(gpu: Mapping[str, Any]) -> str:
    names = [n for n in gpu.get("clock_event_names") or () if n != "gpu_idle"]
    if names:
        return ",".join(names)
    return "idle" if gpu.get("clock_event_names") else "-"


def _why(verdict: Mapping[str, Any]) -> str:
    """The degraded findings, else the verdict's own reasons (unhealthy, busy, ...)."""
    degraded = [d.get("text", "") for d in verdict.get("degraded") or ()]
    if degraded:
        return "degraded: " + "; ".join(degraded)
    return "; ".join(verdict.get("reasons") or ())


def gpu_table(
    gpus: Sequence[Mapping[str, Any]],
    health: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Mapping[str, float]],
) -> list[str]:
    """The table's lines (header first); `metrics` maps a GPU index (as text) to its last measured metrics."""
    verdicts = {h["index"]: h for h in health}
    columns = [*METRIC_COLUMNS, BUSBW]
    rows = [["GPU", "name", "verdict", "temp", "pcie", "nvlink", "clocks", *(c[1] for c in columns), "why"]]
    for gpu in gpus:
        idx = gpu["index"]
        verdict = verdicts.get(idx, {})
        measured = metrics.get(str(idx)) or {}
        rows.append(
            [
                str(idx),
                (gpu.get("name") or "n/a")[:26],
                str(verdict.get("verdict", "?")),
                _pair(gpu.get("temperature_c"), gpu.get("temperature_slowdown_c"), "C"),
                _pcie(gpu),
                _pair(gpu.get("nvlink_active"), gpu.get("nvlink_links")) if gpu.get("nvlink_links") else "none",
                _clocks(gpu),
                *(_num(measured.get(key)) for key, _ in columns),
                _why(verdict),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    right = {0, *range(7, 7 + len(columns))}  # numbers align right
    lines = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    return lines

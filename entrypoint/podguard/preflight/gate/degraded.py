"""Degraded GPUs: they work, but would slow the whole job down (docs/gate.md, "Degraded GPUs").

    Degraded(code="pcie_width", text="PCIe link x8 of x16", values={"width": 8, "max_width": 16})

A finding is data: `code` names the condition, `text` is the line a person reads, `values` the numbers that
triggered it. NVML conditions (clocks, temperature, PCIe, NVLink) and slow-GPU probe metrics (gate/slow.py)
produce the same record; the policy (`--degraded fail|warn|exclude`) decides what a finding does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from podguard.records import Record

__all__ = ["Degraded", "DegradedPolicy"]


class DegradedPolicy(StrEnum):
    FAIL = "fail"  # a degraded GPU is UNHEALTHY (76)
    WARN = "warn"  # it passes with a warning line
    EXCLUDE = "exclude"  # it is left out of the selection when the rest still meets the expected count


@dataclass(frozen=True)
class Degraded(Record):
    """One reason a GPU is degraded."""

    code: str  # hw_slowdown | hw_thermal_slowdown | hw_power_brake | temperature | pcie_width | nvlink_down | slow
    text: str  # one line a person reads, with the numbers
    values: dict[str, float | int | str] = field(default_factory=dict)

"""The GPUs a node uses, as records every layer shares: the preflight makes them, launch modes read them.

    selection.child_env()       # {"CUDA_VISIBLE_DEVICES": "GPU-...,GPU-...", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    selection.child_env_for(1)  # only the second selected GPU (per-gpu mode)

How a selection is made from GPU_LIST / CUDA_VISIBLE_DEVICES / NPROC_PER_NODE: `preflight/selection.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podguard.records import Record

__all__ = ["SelectedGpu", "Selection"]


@dataclass(frozen=True)
class SelectedGpu(Record):
    index: int  # NVML index (PCI bus order), used for labels like "GPU2"
    uuid: str | None  # "GPU-..." (None only where NVML could not report it)
    visible_id: str  # what to put in CUDA_VISIBLE_DEVICES for this GPU: UUID, MIG UUID, or index
    name: str | None = None


@dataclass(frozen=True)
class Selection(Record):
    gpus: tuple[SelectedGpu, ...]
    source: str  # "GPU_LIST", "CUDA_VISIBLE_DEVICES", "all", "none"
    inventory_count: int
    expected: int | None = None
    warnings: tuple[str, ...] = ()

    @property
    def cpu_only(self) -> bool:
        return not self.gpus

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def child_env(self) -> dict[str, str]:
        """Environment for a child that should see every selected GPU (single mode, torchrun)."""
        if self.cpu_only:
            return {"CUDA_VISIBLE_DEVICES": ""}
        return {"CUDA_VISIBLE_DEVICES": ",".join(g.visible_id for g in self.gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    @property
    def mig_devices(self) -> dict[int, tuple[str, ...]]:
        """GPU index -> the selected MIG devices of it (only GPUs selected by MIG device)."""
        out: dict[int, list[str]] = {}
        for g in self.gpus:
            if g.visible_id.startswith("MIG-"):
                out.setdefault(g.index, []).append(g.visible_id)
        return {i: tuple(m) for i, m in out.items()}

    def derived(self) -> dict[str, Any]:
        return {"child_env": self.child_env()}

    def child_env_for(self, position: int) -> dict[str, str]:
        """Environment for a child that should see only the `position`-th selected GPU (per-gpu mode)."""
        gpu = self.gpus[position]
        return {"CUDA_VISIBLE_DEVICES": gpu.visible_id, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

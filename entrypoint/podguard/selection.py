"""Which GPUs this node will use: GPU_LIST / CUDA_VISIBLE_DEVICES / NPROC_PER_NODE / expected count.

NVML numbers GPUs in PCI bus order; CUDA's default order is "fastest first". Children are therefore
given the selected GPUs by UUID (and CUDA_DEVICE_ORDER=PCI_BUS_ID), so "GPU 2" means the same card in
podguard's report, in nvidia-smi and inside the training process.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SelectedGpu:
    index: int  # NVML index (PCI bus order), used for labels like "GPU2"
    uuid: str | None  # "GPU-..." (None only where NVML could not report it)
    visible_id: str  # what to put in CUDA_VISIBLE_DEVICES for this GPU: UUID, MIG UUID, or index
    name: str | None = None


@dataclass(frozen=True)
class Selection:
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

    def child_env_for(self, position: int) -> dict[str, str]:
        """Environment for a child that should see only the `position`-th selected GPU (per-gpu mode)."""
        gpu = self.gpus[position]
        return {"CUDA_VISIBLE_DEVICES": gpu.visible_id, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

"""Open the accelerator backend, treating "no NVIDIA library" as a CPU-only node rather than an error."""

from __future__ import annotations

from podguard.gpu.backend import GpuBackend, NvmlFailure, NvmlUnavailable
from podguard.gpu.nvml import NvmlBackend

__all__ = ["open_backend"]


def open_backend() -> GpuBackend | None:
    """The NVML backend, or None on a node without an NVIDIA driver library (a CPU-only pod).

    Any other NVML failure (driver not loaded, version mismatch, a lost GPU) is raised as
    `NvmlUnavailable`: those are broken GPU nodes, not CPU nodes, and must not silently fall back.
    """
    try:
        return NvmlBackend()
    except NvmlUnavailable as exc:
        if exc.kind is NvmlFailure.LIBRARY_NOT_FOUND:
            return None
        raise

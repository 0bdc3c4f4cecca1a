"""The read-only view of GPU holders that `podguard doctor` prints, by the same evidence rules as cleanup.

view = describe_holders(backend, [0, 1], dev_dir="/dev")
view["gpus"]["0"]  # ["pid 123 python train.py (fd+NVML, 10.0 GiB)"]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from podguard.gpu.backend import GpuBackend, GpuSnapshot
from podguard.preflight.cleanup.planner import plan_cleanup, short
from podguard.preflight.cleanup.vocabulary import Evidence
from podguard.units import describe_memory

__all__ = ["describe_holders"]

_HOW = {
    Evidence.FD_CUDA: "fd and a CUDA context, NVML speaks host PIDs",
    Evidence.BOTH: "fd+NVML",
    Evidence.FD: "fd, below an NVML-listed parent",
    Evidence.NVML: "NVML only, fds unreadable",
}


def describe_holders(
    backend: GpuBackend,
    gpu_indices: Iterable[int],
    *,
    dev_dir: str | os.PathLike[str] | None = None,
    protect: Sequence[str] = (),
    snapshots: Mapping[int, GpuSnapshot] | None = None,
) -> dict[str, Any]:
    """Who holds each GPU: `{"gpus": {"0": [str]}, "foreign": [str], "foreign_detail": [dict],
    "monitors": [pid], "uninspectable": [pid], "plan": CleanupPlan.to_dict()}`."""
    indices = tuple(gpu_indices)
    plan = plan_cleanup(backend, indices, dev_dir=dev_dir, protect=protect, all_gpus=True, snapshots=snapshots)
    notes = {s.pid: s.code.value for s in plan.skipped}
    per_gpu: dict[str, list[str]] = {str(i): [] for i in indices}
    for h in plan.holders:
        note = f" [{notes[h.pid]}]" if h.pid in notes else ""
        for g in h.gpus:
            if str(g) in per_gpu:
                mem = h.memory.get(g)
                mem_text = f", {describe_memory(mem)}" if mem is not None else ""
                per_gpu[str(g)].append(f"pid {h.pid} {short(h.cmdline, 80)} ({_HOW[h.evidence]}{mem_text}){note}")
    return {
        "gpus": per_gpu,
        "foreign": [f"pid {f.pid} on GPU{f.gpu} ({describe_memory(f.used_memory)}): {f.reason}" for f in plan.foreign],
        "foreign_detail": [f.to_dict() for f in plan.foreign],
        "monitors": list(plan.monitors),
        "uninspectable": list(plan.uninspectable),
        "plan": plan.to_dict(),
    }

"""Reading one NVML device handle: stateless helpers of `NvmlBackend` (gpu/nvml.py).

    processes(handle, reader)            # compute then graphics processes, or None when NVML cannot tell
    ecc_state(handle, reader)            # EccState
    recovery_action(field_value, reader) # "none", "gpu_reset", ... from NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    nvlink_active(handle, reader, links) # how many NVLink links are up

Each takes a `Reader` (gpu/nvml_support.py), which makes the calls and records what NVML could not answer.
"""

from __future__ import annotations

import functools
from typing import Any

from podguard.gpu.backend import EccState, GpuProcess
from podguard.gpu.nvml_support import (
    NVLINK_UP_STATES,
    NVML_FEATURE_ENABLED,
    NVML_FI_DEV_NVLINK_GET_STATE,
    NVML_SUCCESS,
    RECOVERY_ACTIONS,
    VALUE_MEMBERS,
    Reader,
)

__all__ = [
    "ecc_state",
    "field_uint",
    "link_state_fields",
    "nvlink_active",
    "process_list",
    "processes",
    "recovery_action",
]


@functools.cache
def link_state_fields(links: int) -> tuple[tuple[int, int], ...]:
    """(NVML_FI_DEV_NVLINK_GET_STATE, link) for each link: the field-value request, built once per count."""
    return tuple((NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(links))


def field_uint(value: Any) -> int | None:
    """An nvmlFieldValue_t's integer value, or None when its query failed."""
    if value.nvmlReturn != NVML_SUCCESS:
        return None
    member = VALUE_MEMBERS.get(int(value.valueType))
    return None if member is None else int(getattr(value.value, member))


def process_list(h: Any, r: Reader, kind: str, mig: str | None) -> list[GpuProcess] | None:
    """One kind's list; None when NVML could not answer (`r.failures` says why)."""
    base = "nvmlDeviceGetComputeRunningProcesses" if kind == "compute" else "nvmlDeviceGetGraphicsRunningProcesses"
    label = f"{kind}_processes"
    infos = r.first(label, (f"{base}_v3", h), (f"{base}_v2", h))
    if label in r.failures:
        return None
    out = []
    for info in infos or ():
        used = info.usedGpuMemory
        memory = int(used) if used is not None else None
        out.append(GpuProcess(pid=int(info.pid), used_memory=memory, kind=kind, mig=mig))
    return out


def processes(h: Any, r: Reader, mig: str | None = None) -> tuple[GpuProcess, ...] | None:
    """Compute then graphics processes; None when the list cannot be read. A graphics list that is
    NOT_SUPPORTED (compute-only boards) counts as empty; any other failure makes the answer unknown."""
    compute = process_list(h, r, "compute", mig)
    graphics = process_list(h, r, "graphics", mig)
    if graphics is None and r.failures.get("graphics_processes") == "NOT_SUPPORTED":
        graphics = []
    if compute is None or graphics is None:
        return None
    return tuple(compute + graphics)


def ecc_state(h: Any, r: Reader) -> EccState:
    mode = r.call("ecc_mode", "nvmlDeviceGetEccMode", h)
    enabled = None if mode is None else mode[0] == NVML_FEATURE_ENABLED
    counts: dict[str, int | None] = {}
    if enabled is not False:  # with ECC off the driver has no counters
        for key, error_type, counter in (
            ("uncorrected_volatile", 1, 0),  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            ("corrected_volatile", 0, 0),
            ("uncorrected_aggregate", 1, 1),  # NVML_AGGREGATE_ECC
            ("corrected_aggregate", 0, 1),
        ):
            counts[key] = r.call(f"ecc_{key}", "nvmlDeviceGetTotalEccErrors", h, error_type, counter)
    retired = r.call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
    remap = r.call("remapped_rows", "nvmlDeviceGetRemappedRows", h)
    return EccState(
        enabled=enabled,
        uncorrected_volatile=counts.get("uncorrected_volatile"),
        corrected_volatile=counts.get("corrected_volatile"),
        uncorrected_aggregate=counts.get("uncorrected_aggregate"),
        corrected_aggregate=counts.get("corrected_aggregate"),
        retired_pages_pending=None if retired is None else retired == NVML_FEATURE_ENABLED,
        remap_pending=None if remap is None else bool(remap[2]),
        remap_failure=None if remap is None else bool(remap[3]),
        remapped_rows_correctable=None if remap is None else int(remap[0]),
        remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
    )


def recovery_action(value: Any, r: Reader) -> str | None:
    if value.nvmlReturn != NVML_SUCCESS:
        r.code("recovery_action", int(value.nvmlReturn))
        return None
    member = VALUE_MEMBERS.get(int(value.valueType))
    if member is None:
        return None
    action = int(getattr(value.value, member))
    return RECOVERY_ACTIONS.get(action, f"unknown_{action}")


def nvlink_active(h: Any, r: Reader, links: int) -> int | None:
    """How many of the GPU's `links` NVLink links are up: one field-values call (a state per link), else
    (drivers without that field) one nvmlDeviceGetNvLinkState call per link. None when neither answers."""
    values = r.call("nvlink", "nvmlDeviceGetFieldValues", h, link_state_fields(links))
    if values:
        up = 0
        for v in values:  # a hot path (every snapshot of an NVLink GPU): no per-value helper calls
            if v.nvmlReturn != NVML_SUCCESS:
                break
            up += v.value.uiVal in NVLINK_UP_STATES  # NVML_VALUE_TYPE_UNSIGNED_INT
        else:
            return up
    up = 0
    for link in range(links):
        state = r.call("nvlink", "nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            return None
        up += int(state == NVML_FEATURE_ENABLED)
    return up

"""`podguard gpus`: the inventory (NVML only, no CUDA context) and the selection this node would use."""

from __future__ import annotations

from typing import Any

from podguard.errors import ExitCode, PodguardError
from podguard.gpu.backend import GpuSnapshot, NvmlUnavailable
from podguard.gpu.factory import open_backend
from podguard.preflight.options import PreflightOptions
from podguard.preflight.report import na
from podguard.preflight.selection import select_for
from podguard.records import to_data
from podguard.units import MIB

__all__ = ["inventory_payload", "read_inventory", "render_inventory"]


def read_inventory() -> tuple[dict[str, Any], list[GpuSnapshot]]:
    """Driver facts and one snapshot per GPU; raises NvmlUnavailable for a broken (not absent) driver."""
    backend = open_backend()
    if backend is None:
        return {"available": False, "failure": "library_not_found"}, []
    try:
        driver = to_data(backend.driver())
        snaps = [backend.snapshot(i) for i in range(backend.device_count())]
    finally:
        backend.close()
    return {"available": True, **driver}, snaps


def inventory_payload(opts: PreflightOptions) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    try:
        nvml, snaps = read_inventory()
    except NvmlUnavailable as exc:
        payload["nvml"] = {"available": False, "failure": exc.kind.value, "detail": exc.detail}
        payload["gpus"] = []
        payload["error"] = {"exit_code": int(ExitCode.GPU_UNHEALTHY), "message": f"NVML: {exc.message}"}
        return payload
    payload["nvml"] = nvml
    payload["gpus"] = [s.to_dict() for s in snaps]
    try:
        selection = select_for(opts, snaps)
        payload["selection"] = selection.to_dict()
        payload["warnings"] = list(selection.warnings)
    except PodguardError as exc:
        payload["selection"] = None
        payload["error"] = {"exit_code": exc.code, "message": exc.message}
    return payload


def render_inventory(payload: dict[str, Any]) -> str:
    lines: list[str] = []
    nvml = payload.get("nvml", {})
    if nvml.get("available"):
        lines.append(
            f"driver {na(nvml.get('driver_version'))}  CUDA {na(nvml.get('cuda_driver_version'))}  "
            f"{len(payload['gpus'])} GPU(s)"
        )
    else:
        lines.append(f"no usable NVIDIA driver ({nvml.get('failure')}): CPU only")
    selected = {g["index"] for g in (payload.get("selection") or {}).get("gpus", [])}
    if payload["gpus"]:
        lines.append(
            f"{'':2}{'idx':>3}  {'name':<26} {'uuid':<14} {'pci':<13} {'mem used/total':>17} {'util':>5} procs"
        )
    for gpu in payload["gpus"]:
        mark = "*" if gpu["index"] in selected else " "
        total, used = gpu.get("memory_total"), gpu.get("memory_used")
        mem = "n/a" if total is None else f"{(used or 0) // MIB}/{total // MIB} MiB"
        uuid = (gpu.get("uuid") or "n/a")[:13]
        lines.append(
            f"{mark} {gpu['index']:>3}  {(gpu.get('name') or 'n/a')[:26]:<26} {uuid:<14} "
            f"{(gpu.get('pci_bus_id') or 'n/a')[-12:]:<13} {mem:>17} {na(gpu.get('utilization_gpu'), '%'):>5} "
            f"{len(gpu.get('processes') or [])}"
        )
    sel = payload.get("selection")
    if sel:
        chosen = ",".join(str(g["index"]) for g in sel["gpus"]) or "none (CPU)"
        lines.append(f"selected ({sel['source']}): {chosen}")
        if sel["gpus"]:
            lines.append(f"children get CUDA_VISIBLE_DEVICES={sel['child_env']['CUDA_VISIBLE_DEVICES']}")
    for warning in payload.get("warnings", []):
        lines.append(f"! {warning}")
    return "\n".join(lines)

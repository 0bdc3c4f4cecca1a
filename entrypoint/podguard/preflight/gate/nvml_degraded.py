"""Degraded GPUs as NVML sees them: clocks, temperature, PCIe width, NVLink (PRODUCT.md "Degraded GPUs").

    found = node_degraded(snapshots)     # {index: (Degraded(code="pcie_width", ...), ...)} for the judged GPUs
    gpu_degraded(snapshot, peer_links=18)

Pure functions over snapshot fields the backend already reads: no NVML call of their own. What counts and
what does not (idle clocks, SW power cap, a low PCIe generation at idle, GPUs without NVLink): docs/gate.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from podguard.gpu.backend import GpuSnapshot
from podguard.preflight.gate.degraded import Degraded

__all__ = ["HW_CLOCK_EVENTS", "gpu_degraded", "node_degraded"]

# Clock event reasons that mean the hardware itself holds the clocks down (decode_clock_events names ->
# finding code, what a person reads). gpu_idle, sw_power_cap, sw_thermal and sync_boost are the driver
# managing a healthy GPU and never count.
HW_CLOCK_EVENTS: dict[str, tuple[str, str]] = {
    "hw_slowdown": ("hw_slowdown", "hardware clock slowdown while idle (HW slowdown: power or thermal signal)"),
    "hw_thermal": ("hw_thermal_slowdown", "hardware thermal slowdown while idle (HW thermal)"),
    "hw_power_brake": ("hw_power_brake", "hardware power brake while idle (the board's power supply asserts it)"),
}


def gpu_degraded(gpu: GpuSnapshot, peer_links: int | None = None, *, alone: bool = False) -> list[Degraded]:
    """Why this GPU would slow a job down. `peer_links`: the most active NVLink links another GPU of the same
    model on this node has (None: no such peer). `alone`: the only GPU judged (its NVLink carries nothing)."""
    out: list[Degraded] = []
    if not gpu.utilization_gpu:  # idle (or not reported): a busy GPU may be capped by its own load
        for name in gpu.clock_event_names:
            if name in HW_CLOCK_EVENTS:
                code, text = HW_CLOCK_EVENTS[name]
                out.append(Degraded(code, text, {"clock_event_reasons": hex(gpu.clock_event_reasons or 0)}))
    temp, slowdown = gpu.temperature_c, gpu.temperature_slowdown_c
    if temp is not None and slowdown is not None and slowdown > 0 and temp >= slowdown:
        text = f"temperature {temp}C at/above its slowdown threshold {slowdown}C"
        out.append(Degraded("temperature", text, {"temperature_c": temp, "slowdown_c": slowdown}))
    width, width_max = gpu.pcie_link_width, gpu.pcie_link_width_max
    if width is not None and width_max is not None and 0 < width < width_max:
        text = f"PCIe link x{width} of x{width_max} (a narrow link: seat, riser or slot)"
        out.append(Degraded("pcie_width", text, {"width": width, "max_width": width_max}))
    out.extend(_nvlink(gpu, peer_links, alone))
    return out


def _nvlink(gpu: GpuSnapshot, peer_links: int | None, alone: bool) -> list[Degraded]:
    links, active = gpu.nvlink_links, gpu.nvlink_active
    if not links or active is None:  # no NVLink (PCIe cards), or its state could not be read
        return []
    if active == 0 and alone:  # one GPU of a board given to this pod alone: no peer to talk to over NVLink
        return []
    if active < links:
        text = f"NVLink {active} of {links} links active"
        return [Degraded("nvlink_down", text, {"active": active, "links": links})]
    if peer_links is not None and active < peer_links:
        text = f"NVLink {active} links active, other GPUs of this model have {peer_links}"
        return [Degraded("nvlink_down", text, {"active": active, "links": links, "peer_links": peer_links})]
    return []


def node_degraded(gpus: Sequence[GpuSnapshot]) -> dict[int, tuple[Degraded, ...]]:
    """Findings for every GPU in `gpus` that has any; NVLink is compared with its same-model peers here."""
    out: dict[int, tuple[Degraded, ...]] = {}
    for gpu in gpus:
        peers = [
            p.nvlink_active
            for p in gpus
            if p.index != gpu.index and p.name == gpu.name and p.nvlink_links and p.nvlink_active is not None
        ]
        found = gpu_degraded(gpu, max(peers) if peers else None, alone=len(gpus) == 1)
        if found:
            out[gpu.index] = tuple(found)
    return out

"""Degraded GPUs as NVML sees them: clocks, temperature, PCIe width, NVLink (docs/gate.md, "Degraded GPUs").

    found = node_degraded(snapshots)     # {index: (Degraded(code="pcie_width", ...), ...)} for the judged GPUs
    gpu_degraded(snapshot, peer_links=18, fabric=True)

Pure functions over snapshot fields the backend already reads: no NVML call of their own. One cause is one
finding (HW slowdown is also set whenever HW thermal or the power brake is). What counts and what does not
(idle clocks, SW power cap, a low PCIe generation at idle, NVLink-capable cards without a bridge), with the
sources: docs/gate.md ("Degraded GPUs"). A finding of one read is confirmed by a second: gate/confirm.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from podguard.gpu.backend import GpuSnapshot
from podguard.preflight.gate.degraded import Degraded

__all__ = ["HW_CLOCK_EVENTS", "bridged_card", "gpu_degraded", "node_degraded"]

# Clock event reasons that mean the hardware itself holds the clocks down (decode_clock_events names ->
# finding code, what a person reads). gpu_idle, sw_power_cap, sw_thermal and sync_boost are the driver
# managing a healthy GPU and never count. nvml.h: HW slowdown "is an indicator of: temperature being too
# high, External Power Brake Assertion ..., may be also reported during PState or clock change".
HW_CLOCK_EVENTS: dict[str, tuple[str, str]] = {
    "hw_slowdown": ("hw_slowdown", "hardware clock slowdown while idle (HW slowdown: power or thermal signal)"),
    "hw_thermal": ("hw_thermal_slowdown", "hardware thermal slowdown while idle (HW thermal)"),
    "hw_power_brake": ("hw_power_brake", "hardware power brake while idle (the board's power supply asserts it)"),
}

# PCIe cards whose NVLink is an optional bridge between pairs (or fours) of cards: A100/H100 PCIe, H100/H200
# NVL, A40, A30, RTX A6000/A5000 and other RTX/Quadro boards. A card without a bridge is a valid build, not a
# link down; SXM/HGX parts (H100 80GB HBM3, H200, A100-SXM4) have no such option.
_BRIDGED = re.compile(r"\bpcie\b|\bnvl\b|\ba(30|40)\b|\brtx\b|\bquadro\b|\ba[456]000\b")


def bridged_card(name: str | None) -> bool:
    """True for a PCIe card whose NVLink, if any, is a bridge someone may or may not have fitted."""
    return _BRIDGED.search((name or "").lower()) is not None


def gpu_degraded(gpu: GpuSnapshot, peer_links: int | None = None, *, alone: bool = False) -> list[Degraded]:
    """Why this GPU would slow a job down. `peer_links`: the most links up on a GPU of the same model on this
    node (None: no such GPU). `alone`: the only GPU judged (its NVLink carries nothing). With no link up on any
    GPU (no fabric) nothing can be "down": 0 of N is then compared with peers that have 0 up too."""
    out = _clocks_and_heat(gpu)
    width, width_max = gpu.pcie_link_width, gpu.pcie_link_width_max
    if width is not None and width_max is not None and 0 < width < width_max:
        text = f"PCIe link x{width} of x{width_max} (a narrow link: seat, riser or slot)"
        out.append(Degraded("pcie_width", text, {"width": width, "max_width": width_max}))
    if not alone:
        out.extend(_nvlink(gpu, peer_links))
    return out


def _clocks_and_heat(gpu: GpuSnapshot) -> list[Degraded]:
    """HW clock reasons while idle and the slowdown temperature, one finding per cause: heat (temperature or
    HW thermal), the power brake, else an HW slowdown that names neither."""
    names = set(gpu.clock_event_names) if not gpu.utilization_gpu else set()  # a busy GPU: its own load
    reasons = {"clock_event_reasons": hex(gpu.clock_event_reasons or 0)}
    temp, slowdown = gpu.temperature_c, gpu.temperature_slowdown_c
    hot = temp is not None and slowdown is not None and slowdown > 0 and temp >= slowdown
    heat = {"temperature_c": temp, "slowdown_c": slowdown} if hot else {}
    out: list[Degraded] = []
    if "hw_thermal" in names:
        code, text = HW_CLOCK_EVENTS["hw_thermal"]
        where = f", temperature {temp}C at/above its slowdown threshold {slowdown}C" if hot else ""
        out.append(Degraded(code, text + where, {**reasons, **heat}))
    elif hot:
        text = f"temperature {temp}C at/above its slowdown threshold {slowdown}C"
        out.append(Degraded("temperature", text, heat))
    if "hw_power_brake" in names:
        code, text = HW_CLOCK_EVENTS["hw_power_brake"]
        out.append(Degraded(code, text, reasons))
    if "hw_slowdown" in names and not out:  # the specific bit (or the heat) already names the cause
        code, text = HW_CLOCK_EVENTS["hw_slowdown"]
        out.append(Degraded(code, text, reasons))
    return out


def _nvlink(gpu: GpuSnapshot, peer_links: int | None) -> list[Degraded]:
    links, active = gpu.nvlink_links, gpu.nvlink_active
    if not links or active is None:  # no NVLink (NOT_SUPPORTED), or its state could not be read: not down
        return []
    bridged = bridged_card(gpu.name)
    if 0 < active < links and not bridged:
        text = f"NVLink {active} of {links} links active"
        return [Degraded("nvlink_down", text, {"active": active, "links": links})]
    if active == 0 and bridged:  # a card without a bridge: nothing to be down
        return []
    # A bridged card's link count is the chip's, not the bridge's: a healthy H100 NVL pair is rated 600 GB/s, 12
    # of the chip's 18 links (docs/gate.md, with the sources). Only its same-model peers tell a lost link.
    if peer_links is not None and active < peer_links:
        text = f"NVLink {active} of {links} links active, other GPUs of this model have {peer_links} up"
        return [Degraded("nvlink_down", text, {"active": active, "links": links, "peer_links": peer_links})]
    return []


def node_degraded(gpus: Sequence[GpuSnapshot]) -> dict[int, tuple[Degraded, ...]]:
    """Findings for every GPU in `gpus` that has any. NVLink is compared with the most links up on a GPU of the
    same model here (itself included: a GPU is never short of itself), so a node where no GPU has a link up (no
    fabric) has no NVLink finding."""
    out: dict[int, tuple[Degraded, ...]] = {}
    for gpu in gpus:
        peers = [p.nvlink_active for p in gpus if p.name == gpu.name and p.nvlink_links and p.nvlink_active is not None]
        found = gpu_degraded(gpu, max(peers) if peers else None, alone=len(gpus) == 1)
        if found:
            out[gpu.index] = tuple(found)
    return out

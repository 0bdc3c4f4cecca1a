"""The health gate's rules: one GPU snapshot (plus probe and XID evidence) -> a verdict with reasons.

Pure functions, no I/O, so every rule is unit-testable and the preflight can explain each verdict.
Verdict priority: unhealthy (hardware/driver: exit 76) > busy (someone is on it: exit 75) > healthy.
Warnings never fail the gate unless the user asks (`--fail-on-warnings`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from podguard.errors import ExitCode
from podguard.gpu.backend import ComputeMode, GpuSnapshot, XidEvent
from podguard.units import MIB

# XIDs that mean the hardware or driver needs attention (NVIDIA's XID catalogue): fallen off the bus,
# double-bit ECC, row-remap events, NVLink errors, contained/uncontained ECC, GSP errors, etc.
# Application faults (13, 31, 43, 45) are not hardware verdicts: they are the job's own crash.
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remap recording event",
    64: "ECC page retirement / row remap recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


class Verdict(StrEnum):
    HEALTHY = "healthy"
    BUSY = "busy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class GateThresholds:
    idle_memory_mib: int = 512  # memory used at or below this (no processes) counts as idle
    temperature_margin_c: int = 0  # warn when temperature >= slowdown threshold - margin
    fail_on_warnings: bool = False


@dataclass(frozen=True)
class ProbeEvidence:
    """What a CUDA (or user) probe child said about one GPU."""

    ok: bool
    reason: str = ""
    duration_ms: float | None = None
    busy: bool = False  # the probe failed because the GPU is in use (busy / out of memory), not broken


@dataclass(frozen=True)
class GpuVerdict:
    index: int
    uuid: str | None
    verdict: Verdict
    reasons: tuple[str, ...] = ()  # why busy / unhealthy
    warnings: tuple[str, ...] = ()
    probe: ProbeEvidence | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "probe": None
            if self.probe is None
            else {"ok": self.probe.ok, "reason": self.probe.reason, "duration_ms": self.probe.duration_ms},
        }


@dataclass(frozen=True)
class GateResult:
    verdicts: tuple[GpuVerdict, ...]
    xids: tuple[XidEvent, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        states = {v.verdict for v in self.verdicts}
        if Verdict.UNHEALTHY in states:
            return ExitCode.GPU_UNHEALTHY
        if Verdict.BUSY in states:
            return ExitCode.GPUS_BUSY
        return ExitCode.OK


def hardware_problems(gpu: GpuSnapshot) -> list[str]:
    """Reasons this GPU needs a pod restart or another machine."""
    problems: list[str] = []
    if gpu.lost:
        problems.append("GPU is lost (fallen off the bus)")
    ecc = gpu.ecc
    if ecc.uncorrected_volatile:
        problems.append(f"{ecc.uncorrected_volatile} uncorrected volatile ECC error(s)")
    if ecc.remap_failure:
        problems.append("row remapping failed")
    if ecc.remap_pending:
        problems.append("row remap pending (needs a GPU reset)")
    if ecc.retired_pages_pending:
        problems.append("retired pages pending (needs a GPU reset)")
    if gpu.recovery_action not in (None, "none"):
        problems.append(f"driver requests recovery action: {gpu.recovery_action}")
    return problems


def busy_reasons(gpu: GpuSnapshot, idle_memory_mib: int) -> list[str]:
    """Reasons this GPU is occupied right now (a retry after cleanup may succeed)."""
    reasons: list[str] = []
    if gpu.processes:
        pids = ", ".join(str(p.pid) for p in gpu.processes[:8])
        more = f" (+{len(gpu.processes) - 8} more)" if len(gpu.processes) > 8 else ""
        reasons.append(f"{len(gpu.processes)} process(es) hold it: pid {pids}{more}")
        if gpu.compute_mode is ComputeMode.EXCLUSIVE_PROCESS:
            reasons.append("compute mode is exclusive-process and a context exists: nobody else can use it")
    if gpu.memory_used is not None and gpu.memory_used > idle_memory_mib * MIB:
        used = gpu.memory_used // MIB
        if gpu.processes:
            reasons.append(f"{used} MiB in use")
        else:
            reasons.append(
                f"{used} MiB in use with no visible process (phantom memory: a context from another "
                "namespace or a dying process; if it persists, stop and start the pod)"
            )
    return reasons


def warnings_for(gpu: GpuSnapshot, thresholds: GateThresholds) -> list[str]:
    warnings: list[str] = []
    hw_slow = [n for n in gpu.clock_event_names if n in ("hw_slowdown", "hw_thermal", "hw_power_brake")]
    if hw_slow and not gpu.utilization_gpu:
        warnings.append(f"hardware slowdown while idle ({', '.join(hw_slow)})")
    if (
        gpu.temperature_c is not None
        and gpu.temperature_slowdown_c is not None
        and gpu.temperature_c >= gpu.temperature_slowdown_c - thresholds.temperature_margin_c
    ):
        warnings.append(f"temperature {gpu.temperature_c}C at/above slowdown threshold {gpu.temperature_slowdown_c}C")
    if gpu.ecc.enabled is False:
        warnings.append("ECC is disabled")
    if (
        gpu.pcie_link_width is not None
        and gpu.pcie_link_width_max is not None
        and gpu.pcie_link_width < gpu.pcie_link_width_max
    ):
        warnings.append(f"PCIe link x{gpu.pcie_link_width} below its maximum x{gpu.pcie_link_width_max}")
    if gpu.ecc.corrected_volatile:
        warnings.append(f"{gpu.ecc.corrected_volatile} corrected volatile ECC error(s)")
    warnings.extend(f"NVML query failed: {e}" for e in gpu.errors)
    return warnings


def judge(
    gpu: GpuSnapshot,
    thresholds: GateThresholds,
    *,
    probe: ProbeEvidence | None = None,
    xids: Iterable[XidEvent] = (),
) -> GpuVerdict:
    problems = hardware_problems(gpu)
    for event in xids:
        if event.gpu_index != gpu.index:
            continue
        label = HARDWARE_XIDS.get(event.xid)
        if label:
            problems.append(f"XID {event.xid} during the gate window: {label}")
    if probe is not None and not probe.ok and not probe.busy:
        problems.append(f"probe failed: {probe.reason}")
    warnings = warnings_for(gpu, thresholds)
    for event in xids:
        if event.gpu_index == gpu.index and event.xid not in HARDWARE_XIDS:
            warnings.append(f"XID {event.xid} during the gate window (application-level)")
    if problems:
        return GpuVerdict(gpu.index, gpu.uuid, Verdict.UNHEALTHY, tuple(problems), tuple(warnings), probe)
    busy = busy_reasons(gpu, thresholds.idle_memory_mib)
    if probe is not None and not probe.ok and probe.busy:
        busy.append(f"probe could not use it: {probe.reason}")
    if busy:
        return GpuVerdict(gpu.index, gpu.uuid, Verdict.BUSY, tuple(busy), tuple(warnings), probe)
    if warnings and thresholds.fail_on_warnings:
        reasons = tuple(f"warning treated as failure: {w}" for w in warnings)
        return GpuVerdict(gpu.index, gpu.uuid, Verdict.UNHEALTHY, reasons, tuple(warnings), probe)
    return GpuVerdict(gpu.index, gpu.uuid, Verdict.HEALTHY, (), tuple(warnings), probe)


def judge_all(
    gpus: Sequence[GpuSnapshot],
    thresholds: GateThresholds,
    *,
    probes: dict[int, ProbeEvidence] | None = None,
    xids: Sequence[XidEvent] = (),
) -> GateResult:
    probes = probes or {}
    verdicts = tuple(judge(g, thresholds, probe=probes.get(g.index), xids=xids) for g in gpus)
    return GateResult(verdicts, tuple(xids))

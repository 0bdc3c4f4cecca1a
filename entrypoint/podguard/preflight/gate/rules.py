"""The health gate's rules: one GPU snapshot (plus probe, XID and lease evidence) -> a verdict with reasons.

    verdict = judge(snapshot, GateThresholds(idle_memory_mib=512), probe=ProbeEvidence(ok=True))
    verdict.verdict, verdict.findings   # Verdict.BUSY, (Finding.PHANTOM_MEMORY,)

Pure functions, no I/O. Priority: unhealthy (76) > degraded (by policy: unhealthy, excluded or a warning) >
in use by its own job (pass) > unknown (75) > busy (75) > healthy. Warnings never fail the gate unless asked.
Why each rule: docs/gate.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from podguard.errors import ExitCode
from podguard.gpu.backend import ComputeMode, GpuSnapshot, XidEvent
from podguard.gpu.xids import HARDWARE_XIDS as _HARDWARE
from podguard.gpu.xids import XID_MEANINGS
from podguard.preflight.gate.degraded import Degraded, DegradedPolicy
from podguard.preflight.gate.nvml_degraded import node_degraded
from podguard.records import Record
from podguard.units import MIB

__all__ = [
    "HARDWARE_XIDS",
    "Finding",
    "GateResult",
    "GateThresholds",
    "GpuVerdict",
    "Issue",
    "ProbeEvidence",
    "Verdict",
    "hardware_problems",
    "judge",
    "judge_all",
    "occupancy",
    "scope_to_mig",
    "unknowns",
    "warnings_for",
]

# XIDs that mean the hardware or driver needs attention (NVIDIA's XID catalogue: gpu/xids.py). Application faults
# (13, 31, 43, 45) are not hardware verdicts: they are the job's own crash.
HARDWARE_XIDS: dict[int, str] = {xid: XID_MEANINGS[xid] for xid in sorted(_HARDWARE)}


class Verdict(StrEnum):
    HEALTHY = "healthy"
    IN_USE = "in_use"  # leased by a live podguard run on this node: its own job is on it (a pass)
    BUSY = "busy"
    UNKNOWN = "unknown"  # NVML cannot tell whether it is free: never a pass
    UNHEALTHY = "unhealthy"
    EXCLUDED = "excluded"  # degraded, and --degraded exclude leaves it out of the selection


class Finding(StrEnum):
    """What a reason is about, as data (reasons are the human text)."""

    LOST = "lost"
    ECC_UNCORRECTED = "ecc_uncorrected"
    REMAP_FAILED = "remap_failed"
    REMAP_PENDING = "remap_pending"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    RECOVERY_ACTION = "recovery_action"
    HARDWARE_XID = "hardware_xid"
    PROBE_FAILED = "probe_failed"
    WARNING_AS_FAILURE = "warning_as_failure"
    HOLDERS = "holders"
    EXCLUSIVE_PROCESS = "exclusive_process"
    MEMORY_IN_USE = "memory_in_use"
    PHANTOM_MEMORY = "phantom_memory"  # memory used with no process: another namespace or a dying context
    PROBE_BUSY = "probe_busy"
    UNKNOWN = "unknown"  # a memory or process query NVML could not answer
    LEASED_BY_JOB = "leased_by_job"
    DEGRADED = "degraded"  # works, but would slow the job down (GpuVerdict.degraded says how)
    ALLREDUCE_FAILED = "allreduce_failed"  # PODGUARD_PROBE=full: the node's all-reduce did not complete


@dataclass(frozen=True)
class Issue:
    finding: Finding
    text: str


@dataclass(frozen=True)
class GateThresholds:
    idle_memory_mib: int = 512  # memory used at or below this (no processes) counts as idle
    temperature_margin_c: int = 0  # warn when temperature >= slowdown threshold - margin
    fail_on_warnings: bool = False
    degraded_policy: DegradedPolicy = DegradedPolicy.FAIL


@dataclass(frozen=True)
class ProbeEvidence(Record):
    """What a CUDA (or user) probe child said about one GPU."""

    ok: bool
    reason: str = ""
    duration_ms: float | None = None
    busy: bool = False  # the probe failed because the GPU is in use (busy / out of memory), not broken
    metrics: dict[str, float] = field(default_factory=dict)  # matmul_tflops, mem_gbps, h2d_gbps, ...


@dataclass(frozen=True)
class GpuVerdict(Record):
    index: int
    uuid: str | None
    verdict: Verdict
    reasons: tuple[str, ...] = ()  # why busy / unknown / unhealthy / in use
    warnings: tuple[str, ...] = ()
    probe: ProbeEvidence | None = None
    findings: tuple[Finding, ...] = ()
    degraded: tuple[Degraded, ...] = ()  # why it would slow the job down, whatever the policy made of it

    @property
    def passes(self) -> bool:
        return self.verdict in (Verdict.HEALTHY, Verdict.IN_USE)


@dataclass(frozen=True)
class GateResult(Record):
    verdicts: tuple[GpuVerdict, ...]
    xids: tuple[XidEvent, ...] = field(default=())
    allreduce: dict[str, object] | None = None  # PODGUARD_PROBE=full: the node's all-reduce (ok, busbw, reason)

    @property
    def exit_code(self) -> ExitCode:
        states = {v.verdict for v in self.verdicts}
        if Verdict.UNHEALTHY in states:
            return ExitCode.GPU_UNHEALTHY
        if states & {Verdict.BUSY, Verdict.UNKNOWN}:
            return ExitCode.GPUS_BUSY
        return ExitCode.OK

    def indices(self, *verdicts: Verdict) -> list[int]:
        return [v.index for v in self.verdicts if v.verdict in verdicts]

    def has(self, finding: Finding) -> bool:
        return any(finding in v.findings for v in self.verdicts)

    @property
    def excluded(self) -> list[GpuVerdict]:
        return [v for v in self.verdicts if v.verdict is Verdict.EXCLUDED]


def scope_to_mig(gpu: GpuSnapshot, mig_uuids: Iterable[str] = ()) -> GpuSnapshot:
    """A MIG-enabled GPU judged by its MIG devices (the named ones, else all): their memory and processes
    replace the parent's, which an unprivileged container cannot read. Other GPUs are returned as they are."""
    if not (gpu.mig_enabled and gpu.mig_devices):
        return gpu
    wanted = set(mig_uuids)
    devices = [m for m in gpu.mig_devices if not wanted or m.uuid in wanted]
    used = [m.memory_used for m in devices]
    unknown = tuple(f"MIG device {m.uuid}: {u}" for m in devices for u in m.unknown)
    return replace(
        gpu,
        memory_used=None if any(u is None for u in used) else sum(u for u in used if u is not None),
        processes=tuple(p for m in devices for p in m.processes),
        unknown=unknown,
    )


def hardware_problems(gpu: GpuSnapshot) -> list[Issue]:
    """Reasons this GPU needs a pod restart or another machine."""
    out: list[Issue] = []
    ecc = gpu.ecc
    for finding, cond, text in (
        (Finding.LOST, gpu.lost, "GPU is lost (fallen off the bus)"),
        (
            Finding.ECC_UNCORRECTED,
            ecc.uncorrected_volatile,
            f"{ecc.uncorrected_volatile} uncorrected volatile ECC error(s)",
        ),
        (Finding.REMAP_FAILED, ecc.remap_failure, "row remapping failed"),
        (Finding.REMAP_PENDING, ecc.remap_pending, "row remap pending (needs a GPU reset)"),
        (Finding.RETIRED_PAGES_PENDING, ecc.retired_pages_pending, "retired pages pending (needs a GPU reset)"),
        (
            Finding.RECOVERY_ACTION,
            gpu.recovery_action not in (None, "none"),
            f"driver requests recovery action: {gpu.recovery_action}",
        ),
    ):
        if cond:
            out.append(Issue(finding, text))
    return out


def unknowns(gpu: GpuSnapshot) -> list[Issue]:
    """Queries NVML could not answer whose answer decides whether the GPU is free."""
    out = [Issue(Finding.UNKNOWN, f"cannot tell whether it is free: {u}") for u in gpu.unknown]
    if gpu.memory_used is None and not any(u.startswith("memory") or ": memory" in u for u in gpu.unknown):
        out.append(Issue(Finding.UNKNOWN, "cannot tell whether it is free: memory use not reported"))
    return out


def occupancy(gpu: GpuSnapshot, idle_memory_mib: int) -> list[Issue]:
    """Reasons this GPU is occupied right now (a retry after cleanup may succeed)."""
    out: list[Issue] = []
    if gpu.processes:
        pids = ", ".join(str(p.pid) for p in gpu.processes[:8])
        more = f" (+{len(gpu.processes) - 8} more)" if len(gpu.processes) > 8 else ""
        out.append(Issue(Finding.HOLDERS, f"{len(gpu.processes)} process(es) hold it: pid {pids}{more}"))
        if gpu.compute_mode is ComputeMode.EXCLUSIVE_PROCESS:
            text = "compute mode is exclusive-process and a context exists: nobody else can use it"
            out.append(Issue(Finding.EXCLUSIVE_PROCESS, text))
    if gpu.memory_used is not None and gpu.memory_used > idle_memory_mib * MIB:
        used = gpu.memory_used // MIB
        if gpu.processes:
            out.append(Issue(Finding.MEMORY_IN_USE, f"{used} MiB in use"))
        else:
            text = (
                f"{used} MiB in use with no visible process (phantom memory: a context from another namespace "
                "or a dying process; if it persists, stop and start the pod)"
            )
            out.append(Issue(Finding.PHANTOM_MEMORY, text))
    return out


def warnings_for(gpu: GpuSnapshot, thresholds: GateThresholds) -> list[str]:
    """What a person should know that does not slow the job (degraded conditions: gate/nvml_degraded.py)."""
    warnings: list[str] = []
    temp, slowdown, margin = gpu.temperature_c, gpu.temperature_slowdown_c, thresholds.temperature_margin_c
    if temp is not None and slowdown is not None and margin > 0 and slowdown - margin <= temp < slowdown:
        warnings.append(f"temperature {temp}C within {margin}C of its slowdown threshold {slowdown}C")
    if gpu.ecc.enabled is False:
        warnings.append("ECC is disabled")
    if gpu.ecc.corrected_volatile:
        warnings.append(f"{gpu.ecc.corrected_volatile} corrected volatile ECC error(s)")
    warnings.extend(f"NVML query failed: {e}" for e in gpu.errors)
    return warnings


def _verdict(
    gpu: GpuSnapshot,
    verdict: Verdict,
    issues: Sequence[Issue],
    warnings: Sequence[str],
    probe: ProbeEvidence | None,
    degraded: Sequence[Degraded] = (),
) -> GpuVerdict:
    findings = tuple(dict.fromkeys(i.finding for i in issues))
    texts = tuple(i.text for i in issues)
    return GpuVerdict(gpu.index, gpu.uuid, verdict, texts, tuple(warnings), probe, findings, tuple(degraded))


def judge(
    gpu: GpuSnapshot,
    thresholds: GateThresholds,
    *,
    probe: ProbeEvidence | None = None,
    xids: Iterable[XidEvent] = (),
    in_use_by: str | None = None,
    degraded: Sequence[Degraded] = (),
    node_problem: str | None = None,
) -> GpuVerdict:
    """The verdict for one GPU. `in_use_by` names the live podguard run leasing it (its own job is on it:
    only hardware, XIDs and the probe count then). `degraded`: why it would slow the job down (NVML and
    slow-probe findings); `thresholds.degraded_policy` decides what they do. `node_problem`: a failure of
    the node's all-reduce this GPU took part in."""
    xids = [e for e in xids if e.gpu_index == gpu.index]
    problems = hardware_problems(gpu)
    problems += [
        Issue(Finding.HARDWARE_XID, f"XID {e.xid} during the gate window: {HARDWARE_XIDS[e.xid]}")
        for e in xids
        if e.xid in HARDWARE_XIDS
    ]
    if probe is not None and not probe.ok and not probe.busy:
        problems.append(Issue(Finding.PROBE_FAILED, f"probe failed: {probe.reason}"))
    if node_problem:
        problems.append(Issue(Finding.ALLREDUCE_FAILED, node_problem))
    warnings = warnings_for(gpu, thresholds)
    warnings += [f"XID {e.xid} during the gate window (application-level)" for e in xids if e.xid not in HARDWARE_XIDS]
    policy = thresholds.degraded_policy
    slow = [Issue(Finding.DEGRADED, f"degraded: {d.text}") for d in degraded]
    if policy is DegradedPolicy.WARN:
        warnings += [i.text for i in slow]
    if problems or (slow and policy is DegradedPolicy.FAIL):
        extra = slow if policy is DegradedPolicy.FAIL else []
        return _verdict(gpu, Verdict.UNHEALTHY, [*problems, *extra], warnings, probe, degraded)
    if slow and policy is DegradedPolicy.EXCLUDE:
        return _verdict(gpu, Verdict.EXCLUDED, slow, warnings, probe, degraded)
    if in_use_by is not None:
        leased = [Issue(Finding.LEASED_BY_JOB, f"in use by its job: {in_use_by}")]
        return _verdict(gpu, Verdict.IN_USE, leased, warnings, probe, degraded)
    unknown = unknowns(gpu)
    if unknown:
        return _verdict(gpu, Verdict.UNKNOWN, unknown, warnings, probe, degraded)
    busy = occupancy(gpu, thresholds.idle_memory_mib)
    if probe is not None and not probe.ok and probe.busy:
        busy.append(Issue(Finding.PROBE_BUSY, f"probe could not use it: {probe.reason}"))
    if busy:
        return _verdict(gpu, Verdict.BUSY, busy, warnings, probe, degraded)
    if warnings and thresholds.fail_on_warnings:
        strict = [Issue(Finding.WARNING_AS_FAILURE, f"warning treated as failure: {w}") for w in warnings]
        return _verdict(gpu, Verdict.UNHEALTHY, strict, warnings, probe, degraded)
    return _verdict(gpu, Verdict.HEALTHY, [], warnings, probe, degraded)


def judge_all(
    gpus: Sequence[GpuSnapshot],
    thresholds: GateThresholds,
    *,
    probes: dict[int, ProbeEvidence] | None = None,
    xids: Sequence[XidEvent] = (),
    in_use: dict[int, str] | None = None,
    degraded: Mapping[int, Sequence[Degraded]] | None = None,
    node_problems: Mapping[int, str] | None = None,
    nvml_degraded: Mapping[int, Sequence[Degraded]] | None = None,
) -> GateResult:
    """Every GPU's verdict. `nvml_degraded`: NVML's degraded findings per GPU as the gate confirmed them (two
    reads, gate/confirm.py); None finds them in `gpus` alone. `degraded` adds others (slow probe metrics) per
    GPU; `node_problems` a node-level failure per GPU it concerns."""
    probes = probes or {}
    in_use = in_use or {}
    found = node_degraded(gpus) if nvml_degraded is None else nvml_degraded
    extra = degraded or {}
    verdicts = tuple(
        judge(
            g,
            thresholds,
            probe=probes.get(g.index),
            xids=xids,
            in_use_by=in_use.get(g.index),
            degraded=(*found.get(g.index, ()), *extra.get(g.index, ())),
            node_problem=(node_problems or {}).get(g.index),
        )
        for g in gpus
    )
    return GateResult(verdicts, tuple(xids))

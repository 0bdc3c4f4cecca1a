"""The gate step of a preflight: NVML checks, then the probe children while XID events are watched, then
(PODGUARD_PROBE=full) one all-reduce across the GPUs that passed; slow GPUs are found from the metrics.

    gate = gate_hardware(backend, targets, opts, mig=selection.mig_devices, in_use={}, mark=timings.mark)
    gate = follow_cleanup(gate, cleanup_result.states)   # a GPU the cleanup could not free never passes

`podguard cleanup` asks a narrower question (`gate_free_now`: is each GPU free now?). The rules: docs/gate.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from podguard.gpu.backend import GpuBackend, GpuSnapshot
from podguard.preflight.gate.confirm import confirmed
from podguard.preflight.gate.degraded import Degraded
from podguard.preflight.gate.nvml_degraded import node_degraded
from podguard.preflight.gate.probe import cuda_probe_available, run_probes
from podguard.preflight.gate.probe.allreduce import run_allreduce
from podguard.preflight.gate.rules import (
    Finding,
    GateResult,
    GateThresholds,
    GpuVerdict,
    ProbeEvidence,
    Verdict,
    hardware_problems,
    judge_all,
    occupancy,
    scope_to_mig,
    unknowns,
)
from podguard.preflight.gate.slow import slow_findings
from podguard.preflight.gate.xid import XidWatcher
from podguard.preflight.options import PreflightOptions, ProbeMode
from podguard.units import MIB

if TYPE_CHECKING:
    from podguard.preflight.cleanup.vocabulary import GpuIdleState

__all__ = ["confirmed_degraded", "follow_cleanup", "follow_faults", "gate_free_now", "gate_hardware", "snapshots"]


def snapshots(backend: GpuBackend, indices: Sequence[int], mig: Mapping[int, Sequence[str]]) -> list[GpuSnapshot]:
    """Fresh snapshots, MIG GPUs judged by their (selected) MIG devices."""
    return [scope_to_mig(backend.snapshot(i), mig.get(i, ())) for i in indices]


def _thresholds(opts: PreflightOptions) -> GateThresholds:
    return GateThresholds(opts.idle_memory_mib, opts.max_temperature_margin_c, opts.fail_on_warnings, opts.degraded)


def gate_free_now(
    backend: GpuBackend, indices: Sequence[int], opts: PreflightOptions, mig: Mapping[int, Sequence[str]]
) -> GateResult:
    """`podguard cleanup`'s question: is each GPU free now? Lost -> unhealthy, unknown -> unknown."""
    verdicts = []
    for snap in snapshots(backend, indices, mig):
        lost = [i for i in hardware_problems(snap) if i.finding is Finding.LOST]
        issues, verdict = lost, Verdict.UNHEALTHY
        if not issues:
            issues, verdict = unknowns(snap), Verdict.UNKNOWN
        if not issues:
            issues, verdict = occupancy(snap, opts.idle_memory_mib), Verdict.BUSY
        if not issues:
            verdict = Verdict.HEALTHY
        findings = tuple(dict.fromkeys(i.finding for i in issues))
        verdicts.append(GpuVerdict(snap.index, snap.uuid, verdict, tuple(i.text for i in issues), (), None, findings))
    return GateResult(tuple(verdicts))


def confirmed_degraded(
    backend: GpuBackend,
    indices: Sequence[int],
    mig: Mapping[int, Sequence[str]],
    reads: Sequence[Sequence[GpuSnapshot]],
    last_read_at: float,
) -> dict[int, tuple[Degraded, ...]]:
    """NVML's degraded findings that two reads agree on (gate/confirm.py); `reads` are the gate's own snapshot
    rounds, oldest first, the last taken at `last_read_at` (time.monotonic()). Reads again only when a finding
    was seen once."""
    return confirmed(
        [node_degraded(r) for r in reads[-2:]],
        lambda: node_degraded(snapshots(backend, indices, mig)),
        last_read_at=last_read_at,
    )


def gate_hardware(
    backend: GpuBackend,
    targets: Sequence[tuple[int, str]],
    opts: PreflightOptions,
    *,
    mig: Mapping[int, Sequence[str]],
    in_use: Mapping[int, str],
    mark: Callable[[str, float], float] | None = None,
) -> GateResult:
    """NVML checks first; then the probe on GPUs that passed them, with XID events watched meanwhile.
    `targets` are (NVML index, CUDA_VISIBLE_DEVICES id) pairs; `in_use` maps GPUs leased by a live
    podguard run to its description (their own job is on them: only hardware counts). Degraded findings
    count once two reads agree; with the probe on, a GPU that was not probed does not pass."""
    indices = list(dict.fromkeys(i for i, _ in targets))
    thresholds = _thresholds(opts)
    first = snapshots(backend, indices, mig)
    first_at = time.monotonic()
    screen = judge_all(first, thresholds, in_use=dict(in_use), nvml_degraded={})  # one read: no degraded verdict
    candidates = [v.index for v in screen.verdicts if v.verdict is Verdict.HEALTHY]
    probe_mode = opts.probe
    if probe_mode == ProbeMode.AUTO:
        probe_mode = ProbeMode.CUDA if (opts.probe_cmd or cuda_probe_available(opts.dev_dir)) else ProbeMode.OFF
    if probe_mode == ProbeMode.OFF and opts.probe_cmd is None:
        watch = [v.index for v in screen.verdicts if v.passes]
        if opts.xid_window_s > 0 and watch:
            xids = backend.watch_xid(watch, opts.xid_window_s)
            last = snapshots(backend, indices, mig)
            found = confirmed_degraded(backend, indices, mig, [first, last], time.monotonic())
            return judge_all(last, thresholds, xids=xids, in_use=dict(in_use), nvml_degraded=found)
        found = confirmed_degraded(backend, indices, mig, [first], first_at)
        return judge_all(first, thresholds, in_use=dict(in_use), nvml_degraded=found)
    if not candidates:
        found = confirmed_degraded(backend, indices, mig, [first], first_at)
        return judge_all(first, thresholds, in_use=dict(in_use), nvml_degraded=found)

    t = time.perf_counter()
    probe_targets: list[tuple[int, str]] = []
    for index, visible in targets:  # one probe per GPU (the first of its selected MIG devices)
        if index in candidates and index not in {i for i, _ in probe_targets}:
            probe_targets.append((index, visible))
    full = probe_mode == ProbeMode.FULL
    watch_s = opts.probe_timeout_s * (2 if full else 1) + 1.0
    watcher: list[XidWatcher] = []
    results = run_probes(
        probe_targets,
        timeout_s=opts.probe_timeout_s,
        probe_cmd=opts.probe_cmd,
        on_started=lambda: watcher.append(XidWatcher(backend, candidates, watch_s)),
    )
    probes = {r.index: ProbeEvidence(r.ok, r.reason, r.duration_ms, r.busy, dict(r.metrics)) for r in results}
    allreduce: dict[str, object] | None = None
    node_problems: dict[int, str] = {}
    if full:
        passed = [(i, v) for i, v in probe_targets if probes[i].ok]
        allreduce, node_problems = _allreduce(passed, opts.probe_timeout_s, probes)
    xids = watcher[0].stop() if watcher else []
    if mark is not None:
        mark("probe", t)
    slow = _slow(probes, first, dict(probe_targets), opts.slow_ratio)
    last = snapshots(backend, indices, mig)
    found = confirmed_degraded(backend, indices, mig, [first, last], time.monotonic())
    result = judge_all(
        last,
        thresholds,
        probes=probes,
        xids=xids,
        in_use=dict(in_use),
        degraded=slow,
        node_problems=node_problems,
        nvml_degraded=found,
    )
    return replace(_unprobed(result, screen, probes), allreduce=allreduce)


def _unprobed(result: GateResult, screen: GateResult, probes: Mapping[int, ProbeEvidence]) -> GateResult:
    """With the probe on, a GPU that was not probed (busy, unknown or unhealthy when the probes started) keeps
    that verdict even when a later snapshot looks clean: it was never measured, so it cannot pass."""
    before = {v.index: v for v in screen.verdicts}
    verdicts = []
    for v in result.verdicts:
        s = before.get(v.index)
        if v.index in probes or v.verdict is not Verdict.HEALTHY or s is None or s.passes:
            verdicts.append(v)
            continue
        note = f"not probed: it was {s.verdict.value} when the probes started"
        verdicts.append(replace(s, reasons=(*s.reasons, note), warnings=v.warnings, degraded=v.degraded))
    return replace(result, verdicts=tuple(verdicts))


def _allreduce(
    targets: Sequence[tuple[int, str]], timeout_s: float, probes: dict[int, ProbeEvidence]
) -> tuple[dict[str, object], dict[int, str]]:
    """PODGUARD_PROBE=full: one all-reduce across `targets` (the GPUs whose probe passed). Its bus bandwidth
    joins each GPU's metrics (the floors judge it); a failure is every participant's problem."""
    if len(targets) < 2:
        return {"ok": True, "skipped": "an all-reduce needs two or more GPUs", "gpus": [i for i, _ in targets]}, {}

    res = run_allreduce(targets, timeout_s)
    record: dict[str, object] = {
        "ok": res.ok,
        "busbw_gbps": res.busbw_gbps,
        "reason": res.reason,
        "duration_ms": res.duration_ms,
        "gpus": [i for i, _ in targets],
    }
    if not res.ok:
        return record, {i: f"node all-reduce across GPU(s) {_ids(targets)} failed: {res.reason}" for i, _ in targets}
    if res.busbw_gbps is not None:
        for i, _ in targets:
            probes[i] = replace(probes[i], metrics={**probes[i].metrics, "allreduce_busbw_gbps": res.busbw_gbps})
    return record, {}


def _slow(
    probes: Mapping[int, ProbeEvidence], first: Sequence[GpuSnapshot], visible: Mapping[int, str], ratio: float
) -> dict[int, list[Degraded]]:
    """Slow GPUs from the probes' metrics (gate/slow.py: relative to the same-model median, the model floors, the
    host link's copy floor). A GPU measured on a MIG slice is judged by its slice's profile, never by floors."""
    metrics = {i: p.metrics for i, p in probes.items() if p.ok and p.metrics}
    if not metrics:
        return {}
    snaps = {s.index: s for s in first}
    names = {i: snaps[i].name or "" if i in snaps else "" for i in metrics}
    links = {i: (snaps[i].pcie_link_gen_max, snaps[i].pcie_link_width_max) for i in metrics if i in snaps}
    slices = {i: _mig_profile(snaps.get(i), visible.get(i, "")) for i in metrics}
    mig = {i: profile for i, profile in slices.items() if profile is not None}
    return slow_findings(metrics, names, ratio, links=links, mig=mig)


def _mig_profile(snap: GpuSnapshot | None, visible: str) -> str | None:
    """The profile of the MIG slice a GPU was measured on (its memory size; the slice's own UUID when that is not
    known, so it is compared with nothing), or None for a whole GPU."""
    if not visible.startswith("MIG-") and not (snap is not None and snap.mig_enabled):
        return None
    device = next((m for m in (snap.mig_devices if snap else ()) if m.uuid == visible), None)
    if device is not None and device.memory_total:
        return f"MIG {device.memory_total // MIB} MiB"
    return visible or "MIG"


def _ids(targets: Sequence[tuple[int, str]]) -> str:
    return ",".join(str(i) for i, _ in targets)


def follow_cleanup(gate: GateResult, states: Mapping[int, GpuIdleState]) -> GateResult:
    """A GPU the cleanup (or the wait) did not leave idle does not pass, whatever a later snapshot says:
    a respawned process may hold its device file before NVML lists it."""
    verdicts = []
    for v in gate.verdicts:
        s = states.get(v.index)
        if s is None or s.idle or v.verdict in (Verdict.UNHEALTHY, Verdict.IN_USE, Verdict.EXCLUDED):
            verdicts.append(v)
            continue
        unknown = s.state == "unknown"  # GpuState values as text: the gate path does not import the cleanup
        finding = Finding.UNKNOWN if unknown else (Finding.PHANTOM_MEMORY if s.state == "phantom" else Finding.HOLDERS)
        reasons = v.reasons if v.verdict in (Verdict.BUSY, Verdict.UNKNOWN) else ()
        verdicts.append(
            GpuVerdict(
                v.index,
                v.uuid,
                Verdict.UNKNOWN if unknown and v.verdict is not Verdict.BUSY else Verdict.BUSY,
                tuple(dict.fromkeys((*reasons, f"after cleanup: {s.detail}"))),
                v.warnings,
                v.probe,
                tuple(dict.fromkeys((*v.findings, finding))),
                v.degraded,
            )
        )
    return GateResult(tuple(verdicts), gate.xids, gate.allreduce)


# What a fault kind of the run-time GPU watch (launch/watch/gpu_faults.py) is, as a gate finding.
_FAULT_FINDINGS = {
    "xid": Finding.HARDWARE_XID,
    "lost": Finding.LOST,
    "ecc_uncorrected": Finding.ECC_UNCORRECTED,
    "recovery_action": Finding.RECOVERY_ACTION,
}


def follow_faults(gate: GateResult, faulted: Mapping[str, tuple[str, str]]) -> GateResult:
    """A GPU that had a fatal fault during an earlier attempt of this job (`--restarts`) is unhealthy, as the gate
    treats the same fault in its own window, whatever a later snapshot says: an Xid 95 or 48 leaves no NVML
    state behind once the driver has recovered the channel. `faulted` maps a GPU's UUID (or `index:N` where the
    UUID was not known) to (the watch's fault kind, its text)."""
    if not faulted:
        return gate
    verdicts = []
    for v in gate.verdicts:
        hit = faulted.get(v.uuid or "") or faulted.get(f"index:{v.index}")
        if hit is None:
            verdicts.append(v)
            continue
        kind, text = hit
        finding = _FAULT_FINDINGS.get(kind, Finding.HARDWARE_XID)
        reason = f"fatal fault during an earlier attempt of this job: {text}"
        verdicts.append(
            replace(
                v,
                verdict=Verdict.UNHEALTHY,
                reasons=tuple(dict.fromkeys((*(v.reasons if v.verdict is Verdict.UNHEALTHY else ()), reason))),
                findings=tuple(dict.fromkeys((*(v.findings if v.verdict is Verdict.UNHEALTHY else ()), finding))),
            )
        )
    return replace(gate, verdicts=tuple(verdicts))

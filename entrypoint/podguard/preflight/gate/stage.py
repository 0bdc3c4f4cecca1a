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
from podguard.preflight.gate.degraded import Degraded
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
from podguard.preflight.gate.xid import XidWatcher
from podguard.preflight.options import PreflightOptions, ProbeMode

if TYPE_CHECKING:
    from podguard.preflight.cleanup.records import GpuIdleState

__all__ = ["follow_cleanup", "gate_free_now", "gate_hardware", "snapshots"]


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
    podguard run to its description (their own job is on them: only hardware counts)."""
    indices = list(dict.fromkeys(i for i, _ in targets))
    thresholds = _thresholds(opts)
    first = snapshots(backend, indices, mig)
    nvml_only = judge_all(first, thresholds, in_use=dict(in_use))
    candidates = [v.index for v in nvml_only.verdicts if v.verdict is Verdict.HEALTHY]
    probe_mode = opts.probe
    if probe_mode == ProbeMode.AUTO:
        from podguard.preflight.gate.probe import cuda_probe_available

        probe_mode = ProbeMode.CUDA if (opts.probe_cmd or cuda_probe_available(opts.dev_dir)) else ProbeMode.OFF
    if probe_mode == ProbeMode.OFF and opts.probe_cmd is None:
        watch = [v.index for v in nvml_only.verdicts if v.passes]
        if opts.xid_window_s > 0 and watch:
            xids = backend.watch_xid(watch, opts.xid_window_s)
            return judge_all(snapshots(backend, indices, mig), thresholds, xids=xids, in_use=dict(in_use))
        return nvml_only
    if not candidates:
        return nvml_only
    from podguard.preflight.gate.probe import run_probes

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
    slow = _slow(probes, {s.index: s.name or "" for s in first}, opts.slow_ratio)
    result = judge_all(
        snapshots(backend, indices, mig),
        thresholds,
        probes=probes,
        xids=xids,
        in_use=dict(in_use),
        degraded=slow,
        node_problems=node_problems,
    )
    return replace(result, allreduce=allreduce)


def _allreduce(
    targets: Sequence[tuple[int, str]], timeout_s: float, probes: dict[int, ProbeEvidence]
) -> tuple[dict[str, object], dict[int, str]]:
    """PODGUARD_PROBE=full: one all-reduce across `targets` (the GPUs whose probe passed). Its bus bandwidth
    joins each GPU's metrics (the floors judge it); a failure is every participant's problem."""
    if len(targets) < 2:
        return {"ok": True, "skipped": "an all-reduce needs two or more GPUs", "gpus": [i for i, _ in targets]}, {}
    try:
        from podguard.preflight.gate.probe.allreduce import run_allreduce
    except ModuleNotFoundError as exc:
        if exc.name != "podguard.preflight.gate.probe.allreduce":
            raise  # the module is there and broken: that is a bug to see, not a probe to skip
        return {"ok": True, "skipped": "the all-reduce probe is not available in this build"}, {}
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


def _slow(probes: Mapping[int, ProbeEvidence], names: Mapping[int, str], ratio: float) -> dict[int, list[Degraded]]:
    """Slow GPUs from the probes' metrics (gate/slow.py: relative to the node's median, and per-model floors)."""
    metrics = {i: p.metrics for i, p in probes.items() if p.ok and p.metrics}
    if not metrics:
        return {}
    try:
        from podguard.preflight.gate.slow import slow_findings
    except ModuleNotFoundError as exc:
        if exc.name != "podguard.preflight.gate.slow":
            raise
        return {}  # the slow-GPU rules are not part of this build
    return slow_findings(metrics, {i: names.get(i, "") for i in metrics}, ratio)


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

"""The gate step's own rules (gate/stage.py) on their own: a GPU that was never probed keeps its verdict, a MIG
slice is compared by its profile, and a GPU that faulted in an earlier attempt is unhealthy (issues 18, 19)."""

from __future__ import annotations

from fakes import h100
from podguard.gpu.backend import MigDevice
from podguard.preflight.gate import stage
from podguard.preflight.gate.rules import Finding, GateResult, GpuVerdict, ProbeEvidence, Verdict
from podguard.units import MIB


def _v(index: int, verdict: Verdict, *reasons: str) -> GpuVerdict:
    return GpuVerdict(index, f"GPU-{index}", verdict, reasons)


def test_an_unprobed_gpu_keeps_its_first_verdict_but_a_worse_later_one_wins():
    screen = GateResult((_v(0, Verdict.BUSY, "2 processes"), _v(1, Verdict.HEALTHY)))
    probes = {1: ProbeEvidence(True)}
    clean_later = GateResult((_v(0, Verdict.HEALTHY), _v(1, Verdict.HEALTHY)))
    kept = stage._unprobed(clean_later, screen, probes)
    assert kept.verdicts[0].verdict is Verdict.BUSY and "not probed" in kept.verdicts[0].reasons[-1]
    assert kept.verdicts[1].verdict is Verdict.HEALTHY
    lost_later = GateResult((_v(0, Verdict.UNHEALTHY, "GPU is lost"), _v(1, Verdict.HEALTHY)))
    worse = stage._unprobed(lost_later, screen, probes)
    assert worse.verdicts[0].verdict is Verdict.UNHEALTHY and worse.verdicts[0].reasons == ("GPU is lost",)


def test_a_mig_slice_is_named_by_its_profile_and_a_whole_gpu_by_none():
    slices = (MigDevice("MIG-a", memory_total=10240 * MIB), MigDevice("MIG-b", memory_total=20480 * MIB))
    snap = h100(0, mig_enabled=True, mig_devices=slices)
    assert stage._mig_profile(snap, "MIG-a") == "MIG 10240 MiB"
    assert stage._mig_profile(snap, "MIG-b") == "MIG 20480 MiB"
    assert stage._mig_profile(snap, "MIG-unknown") == "MIG-unknown"  # compared with nothing
    assert stage._mig_profile(h100(1), "1") is None


def test_a_gpu_that_faulted_in_an_earlier_attempt_is_unhealthy_whatever_it_looks_like_now():
    gate = GateResult((_v(0, Verdict.HEALTHY), _v(1, Verdict.HEALTHY), _v(2, Verdict.BUSY, "1 process")))
    faulted = {"GPU-0": ("xid", "GPU 0 (GPU-0): Xid 95: uncontained ECC error"), "index:2": ("lost", "GPU 2: lost")}
    out = stage.follow_faults(gate, faulted)
    v0, v1, v2 = out.verdicts
    assert v0.verdict is Verdict.UNHEALTHY and v0.findings == (Finding.HARDWARE_XID,)
    assert v0.reasons == (
        "fatal fault during an earlier attempt of this job: GPU 0 (GPU-0): Xid 95: uncontained ECC error",
    )
    assert v1.verdict is Verdict.HEALTHY
    assert v2.verdict is Verdict.UNHEALTHY and v2.findings == (Finding.LOST,) and len(v2.reasons) == 1
    assert stage.follow_faults(gate, {}) is gate

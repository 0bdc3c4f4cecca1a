"""Health gate rules: each hardware signal -> unhealthy, holders/phantom memory -> busy, warnings stay warnings."""

from __future__ import annotations

import pytest

from fakes import h100
from podguard.gpu.backend import ComputeMode, EccState, GpuProcess, MigDevice, XidEvent
from podguard.preflight.gate.rules import (
    Finding,
    GateThresholds,
    ProbeEvidence,
    Verdict,
    judge,
    judge_all,
    scope_to_mig,
)

T = GateThresholds()
LIVE = GpuProcess(pid=1, used_memory=4 << 30, kind="compute")


def test_healthy_idle_gpu():
    v = judge(h100(0), T)
    assert v.verdict is Verdict.HEALTHY and not v.reasons and not v.warnings


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"lost": True}, "lost"),
        ({"ecc": EccState(enabled=True, uncorrected_volatile=2)}, "2 uncorrected volatile ECC"),
        ({"ecc": EccState(enabled=True, remap_pending=True)}, "row remap pending"),
        ({"ecc": EccState(enabled=True, remap_failure=True)}, "row remapping failed"),
        ({"ecc": EccState(enabled=True, retired_pages_pending=True)}, "retired pages pending"),
        ({"recovery_action": "reboot"}, "recovery action: reboot"),
    ],
)
def test_hardware_problems_are_unhealthy(changes, needle):
    v = judge(h100(3, **changes), T)
    assert v.verdict is Verdict.UNHEALTHY
    assert any(needle in r for r in v.reasons)


def test_failed_probe_and_hardware_xid_are_unhealthy_application_xid_is_a_warning():
    assert judge(h100(0), T, probe=ProbeEvidence(False, "probe timed out after 5s")).verdict is Verdict.UNHEALTHY
    v = judge(h100(2), T, xids=[XidEvent(2, 79, 0.0), XidEvent(1, 48, 0.0)])
    assert v.verdict is Verdict.UNHEALTHY and any("XID 79" in r for r in v.reasons)
    assert not any("XID 48" in r for r in v.reasons)  # another GPU's event
    app = judge(h100(2), T, xids=[XidEvent(2, 13, 0.0)])
    assert app.verdict is Verdict.HEALTHY and any("XID 13" in w for w in app.warnings)


def test_holders_exclusive_mode_and_phantom_memory_are_busy():
    held = judge(h100(0, processes=(LIVE,), memory_used=4 << 30, compute_mode=ComputeMode.EXCLUSIVE_PROCESS), T)
    assert held.verdict is Verdict.BUSY
    assert any("exclusive-process" in r for r in held.reasons)
    phantom = judge(h100(1, memory_used=2 << 30), T)
    assert phantom.verdict is Verdict.BUSY and any("phantom" in r for r in phantom.reasons)
    assert judge(h100(1, memory_used=100 << 20), T).verdict is Verdict.HEALTHY  # under the idle threshold


def test_unhealthy_wins_over_busy_and_sets_exit_76():
    gpus = [h100(0, processes=(LIVE,)), h100(1, lost=True), h100(2)]
    result = judge_all(gpus, T)
    assert [v.verdict for v in result.verdicts] == [Verdict.BUSY, Verdict.UNHEALTHY, Verdict.HEALTHY]
    assert result.exit_code == 76
    assert judge_all([h100(0, processes=(LIVE,))], T).exit_code == 75
    assert judge_all([h100(0)], T).exit_code == 0


def test_warnings_do_not_fail_unless_asked():
    warm = h100(0, temperature_c=84, ecc=EccState(enabled=False, corrected_volatile=3))
    v = judge(warm, GateThresholds(temperature_margin_c=5))
    assert v.verdict is Verdict.HEALTHY and not v.degraded
    text = " ".join(v.warnings)
    for needle in ("within 5C of its slowdown threshold 87C", "ECC is disabled", "3 corrected volatile ECC"):
        assert needle in text
    assert not judge(warm, T).warnings[0].startswith("temperature")  # no margin: no temperature warning
    strict = judge(warm, GateThresholds(fail_on_warnings=True))
    assert strict.verdict is Verdict.UNHEALTHY


def test_unknown_memory_or_process_list_never_passes():
    """Issue 7 item 4: what NVML cannot answer is unknown (exit 75), not idle."""
    for snap in (h100(0, unknown=("processes: NO_PERMISSION",)), h100(0, memory_used=None)):
        v = judge(snap, T)
        assert v.verdict is Verdict.UNKNOWN and not v.passes and Finding.UNKNOWN in v.findings
        assert any("cannot tell whether it is free" in r for r in v.reasons)
    assert judge_all([h100(0, unknown=("memory: NOT_SUPPORTED",)), h100(1)], T).exit_code == 75
    assert judge(h100(0, unknown=("memory: x",), lost=True), T).verdict is Verdict.UNHEALTHY  # hardware first


def test_a_gpu_in_use_by_its_own_job_passes_unless_its_hardware_is_bad():
    """Issue 7 item 7: a GPU leased by a live podguard run is in use as expected."""
    held = h100(0, processes=(LIVE,), memory_used=4 << 30)
    v = judge(held, T, in_use_by="podguard run pid 7 (podguard train), alive")
    assert v.verdict is Verdict.IN_USE and v.passes and "pid 7" in v.reasons[0]
    assert judge_all([held], T, in_use={0: "pid 7"}).exit_code == 0
    bad = h100(0, processes=(LIVE,), ecc=EccState(enabled=True, uncorrected_volatile=1))
    assert judge(bad, T, in_use_by="pid 7").verdict is Verdict.UNHEALTHY


def test_phantom_memory_is_carried_as_a_finding_not_found_in_text():
    phantom = judge_all([h100(1, memory_used=2 << 30)], T)
    assert phantom.has(Finding.PHANTOM_MEMORY) and not phantom.has(Finding.HOLDERS)
    assert judge_all([h100(1, processes=(LIVE,), memory_used=2 << 30)], T).has(Finding.HOLDERS)


def test_a_mig_gpu_is_judged_by_its_selected_devices():
    slices = (
        MigDevice("MIG-a", memory_used=0),
        MigDevice("MIG-b", memory_used=4 << 30, processes=(LIVE,)),
    )
    parent = h100(0, mig_enabled=True, mig_devices=slices, memory_used=None, unknown=("processes: NO_PERMISSION",))
    assert judge(scope_to_mig(parent, ["MIG-a"]), T).verdict is Verdict.HEALTHY
    assert judge(scope_to_mig(parent, ["MIG-b"]), T).verdict is Verdict.BUSY
    assert judge(scope_to_mig(parent), T).verdict is Verdict.BUSY  # all of its devices
    unreadable = h100(0, mig_enabled=True, mig_devices=(MigDevice("MIG-c", unknown=("memory: NO_PERMISSION",)),))
    assert judge(scope_to_mig(unreadable), T).verdict is Verdict.UNKNOWN

"""Degraded GPUs from NVML snapshots: what counts, what is normal, and what each policy makes of it."""

from __future__ import annotations

import pytest

from fakes import h100
from podguard.gpu.backend import EccState, decode_clock_events
from podguard.preflight.gate.degraded import Degraded, DegradedPolicy
from podguard.preflight.gate.nvml_degraded import gpu_degraded, node_degraded
from podguard.preflight.gate.rules import Finding, GateThresholds, ProbeEvidence, Verdict, judge, judge_all

FAIL, WARN, EXCLUDE = (GateThresholds(degraded_policy=p) for p in DegradedPolicy)


def clocks(mask: int, **changes: object):
    return h100(0, clock_event_reasons=mask, clock_event_names=decode_clock_events(mask), **changes)


@pytest.mark.parametrize(
    ("snapshot", "code", "needle", "values"),
    [
        (clocks(0x1 | 0x8), "hw_slowdown", "hardware clock slowdown while idle", {"clock_event_reasons": "0x9"}),
        (clocks(0x40), "hw_thermal_slowdown", "thermal slowdown", {"clock_event_reasons": "0x40"}),
        (clocks(0x80), "hw_power_brake", "power brake", {"clock_event_reasons": "0x80"}),
        (h100(0, temperature_c=87), "temperature", "87C at/above its slowdown threshold 87C", {"temperature_c": 87}),
        (h100(0, pcie_link_width=8), "pcie_width", "PCIe link x8 of x16", {"width": 8, "max_width": 16}),
        (h100(0, nvlink_links=18, nvlink_active=17), "nvlink_down", "NVLink 17 of 18", {"active": 17, "links": 18}),
    ],
)
def test_each_condition_is_a_degraded_finding_with_its_numbers(snapshot, code, needle, values):
    (found,) = gpu_degraded(snapshot)
    assert found.code == code and needle in found.text
    assert values.items() <= found.values.items()
    verdict = judge_all([snapshot], FAIL).verdicts[0]
    assert verdict.verdict is Verdict.UNHEALTHY and Finding.DEGRADED in verdict.findings
    assert verdict.degraded == (found,) and any(needle in r for r in verdict.reasons)


@pytest.mark.parametrize(
    "snapshot",
    [
        clocks(0x1),  # idle
        clocks(0x4),  # SW power cap
        clocks(0x20 | 0x2 | 0x10),  # SW thermal, application clocks, sync boost: the driver managing the GPU
        clocks(0x8 | 0x80, utilization_gpu=97),  # a GPU under load may be braked by its own load
        h100(0, pcie_link_gen=1, pcie_link_gen_max=5),  # the generation drops at idle by design
        h100(0, nvlink_links=None, nvlink_active=None),  # a PCIe card without NVLink
        h100(0, nvlink_links=18, nvlink_active=None),  # link states that could not be read: unknown, not down
        h100(0, temperature_c=86),
        h100(0, pcie_link_width=16, pcie_link_width_max=None),
    ],
)
def test_normal_conditions_are_not_degraded(snapshot):
    assert gpu_degraded(snapshot) == []
    assert judge_all([snapshot], FAIL).verdicts[0].verdict is Verdict.HEALTHY


def test_nvlink_is_compared_with_same_model_peers():
    full = [h100(i, nvlink_links=18, nvlink_active=18) for i in range(3)]
    short = h100(3, nvlink_links=12, nvlink_active=12)  # fewer links reported than its peers have up
    other_model = h100(4, name="NVIDIA A100-SXM4-80GB", nvlink_links=12, nvlink_active=12)
    found = node_degraded([*full, short, other_model])
    assert list(found) == [3]
    assert found[3][0].values == {"active": 12, "links": 12, "peer_links": 18}
    assert "other GPUs of this model have 18" in found[3][0].text


def test_a_lone_gpu_with_no_active_nvlink_is_not_degraded_but_a_partly_trained_one_is():
    isolated = h100(0, nvlink_links=18, nvlink_active=0)  # one GPU of an HGX board handed to a pod alone
    assert node_degraded([isolated]) == {}
    assert node_degraded([h100(0, nvlink_links=18, nvlink_active=9)])[0][0].code == "nvlink_down"
    both = node_degraded([isolated, h100(1, nvlink_links=18, nvlink_active=0)])
    assert sorted(both) == [0, 1] and both[0][0].text == "NVLink 0 of 18 links active"  # two GPUs need the fabric


def test_warn_passes_with_a_warning_and_exclude_leaves_it_out_without_failing():
    gpus = [h100(0), h100(1, pcie_link_width=4)]
    warned = judge_all(gpus, WARN)
    assert warned.exit_code == 0 and warned.verdicts[1].verdict is Verdict.HEALTHY
    assert warned.verdicts[1].warnings == ("degraded: PCIe link x4 of x16 (a narrow link: seat, riser or slot)",)
    assert warned.verdicts[1].degraded[0].code == "pcie_width"  # the finding is data whatever the policy
    assert judge_all(gpus, GateThresholds(fail_on_warnings=True, degraded_policy=DegradedPolicy.WARN)).exit_code == 76
    excluded = judge_all(gpus, EXCLUDE)
    assert excluded.exit_code == 0 and [v.index for v in excluded.excluded] == [1]
    assert excluded.verdicts[1].reasons[0].startswith("degraded: PCIe link x4")


def test_exclude_is_for_degraded_gpus_only_broken_ones_stay_unhealthy():
    broken = h100(0, pcie_link_width=8, ecc=EccState(enabled=True, uncorrected_volatile=1))
    v = judge_all([broken], EXCLUDE).verdicts[0]
    assert v.verdict is Verdict.UNHEALTHY and Finding.DEGRADED not in v.findings and v.degraded


def test_slow_findings_from_the_gate_and_node_problems_join_the_verdict():
    slow = Degraded("slow", "matmul_tflops 400 below 0.8 x median 700", {"matmul_tflops": 400.0})
    result = judge_all(
        [h100(0), h100(1), h100(2)],
        FAIL,
        probes={i: ProbeEvidence(True, metrics={"matmul_tflops": 700.0}) for i in range(3)},
        degraded={1: [slow]},
        node_problems={2: "node all-reduce across GPU(s) 0,2 failed: NCCL timeout"},
    )
    assert [v.verdict for v in result.verdicts] == [Verdict.HEALTHY, Verdict.UNHEALTHY, Verdict.UNHEALTHY]
    assert result.verdicts[1].degraded == (slow,) and "degraded: matmul_tflops 400" in result.verdicts[1].reasons[0]
    assert Finding.ALLREDUCE_FAILED in result.verdicts[2].findings
    assert result.verdicts[0].probe.metrics == {"matmul_tflops": 700.0}
    assert result.to_dict()["verdicts"][1]["degraded"][0] == {
        "code": "slow",
        "text": slow.text,
        "values": {"matmul_tflops": 400.0},
    }


def test_a_gpu_busy_with_its_own_job_is_still_judged_on_its_link():
    v = judge(
        h100(0, pcie_link_width=8, utilization_gpu=90),
        FAIL,
        in_use_by="pid 7",
        degraded=gpu_degraded(h100(0, pcie_link_width=8)),
    )
    assert v.verdict is Verdict.UNHEALTHY

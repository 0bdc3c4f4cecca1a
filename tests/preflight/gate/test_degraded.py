"""Degraded GPUs from NVML snapshots: what counts, what is normal, and what each policy makes of it."""

from __future__ import annotations

import pytest

from fakes import h100
from podguard.gpu.backend import EccState, decode_clock_events
from podguard.preflight.gate.degraded import Degraded, DegradedPolicy
from podguard.preflight.gate.nvml_degraded import bridged_card, gpu_degraded, node_degraded
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


def test_nvlink_down_is_a_finding_with_its_numbers_on_a_node_with_a_fabric():
    node = [h100(0, nvlink_links=18, nvlink_active=18), h100(1, nvlink_links=18, nvlink_active=17)]
    (found,) = node_degraded(node)[1]
    assert found.code == "nvlink_down" and found.text == "NVLink 17 of 18 links active"
    assert found.values == {"active": 17, "links": 18}
    verdicts = judge_all(node, FAIL).verdicts
    assert [v.verdict for v in verdicts] == [Verdict.HEALTHY, Verdict.UNHEALTHY]
    assert Finding.DEGRADED in verdicts[1].findings and verdicts[1].reasons == ("degraded: " + found.text,)


def test_nvlink_is_compared_with_same_model_peers():
    full = [h100(i, nvlink_links=18, nvlink_active=18) for i in range(3)]
    short = h100(3, nvlink_links=12, nvlink_active=12)  # fewer links reported than its peers have up
    other_model = h100(4, name="NVIDIA A100-SXM4-80GB", nvlink_links=12, nvlink_active=12)
    found = node_degraded([*full, short, other_model])
    assert list(found) == [3]
    assert found[3][0].values == {"active": 12, "links": 12, "peer_links": 18}
    assert found[3][0].text == "NVLink 12 of 12 links active, other GPUs of this model have 18 up"


def test_an_hgx_gpu_with_every_link_down_beside_peers_with_links_up_is_caught():
    node = [h100(0, nvlink_links=18, nvlink_active=18), h100(1, nvlink_links=18, nvlink_active=0)]
    found = node_degraded(node)
    assert list(found) == [1] and found[1][0].values == {"active": 0, "links": 18, "peer_links": 18}


@pytest.mark.parametrize("count", [2, 4, 8])
@pytest.mark.parametrize(
    ("name", "links"),
    [("NVIDIA A40", 4), ("NVIDIA RTX A6000", 4), ("NVIDIA A100 80GB PCIe", 12), ("NVIDIA H100 PCIe", 18)],
)
def test_nvlink_capable_pcie_cards_without_a_bridge_are_not_degraded(name, links, count):
    """NVML reports the links of a bridge-less PCIe card, all inactive: no fabric, no finding (issue 18)."""
    node = [h100(i, name=name, nvlink_links=links, nvlink_active=0) for i in range(count)]
    assert node_degraded(node) == {}
    assert judge_all(node, FAIL).exit_code == 0


def test_hgx_gpus_with_no_link_up_at_all_have_no_nvlink_finding_the_all_reduce_measures_them():
    node = [h100(i, nvlink_links=18, nvlink_active=0) for i in range(8)]
    assert node_degraded(node) == {}


def test_bridged_pcie_pairs_with_one_link_down_are_caught_and_an_unbridged_card_beside_them_is_not():
    a40 = "NVIDIA A40"
    node = [
        h100(0, name=a40, nvlink_links=4, nvlink_active=4),
        h100(1, name=a40, nvlink_links=4, nvlink_active=3),  # the bridge of pair 0-1 lost a link
        h100(2, name=a40, nvlink_links=4, nvlink_active=0),  # no bridge fitted: a valid build
        h100(3, name=a40, nvlink_links=4, nvlink_active=0),
    ]
    found = node_degraded(node)
    assert list(found) == [1]
    assert found[1][0].text == "NVLink 3 of 4 links active, other GPUs of this model have 4 up"


def test_a_healthy_bridged_h100_nvl_pair_uses_12_of_the_chips_18_links_and_passes():
    """A bridged card's link count is the chip's: an H100 NVL pair is NV12 on a chip with 18 links. Only the
    same-model peers tell a bridge that lost links; an SXM part with 12 of 18 up is caught on its own."""
    nvl = "NVIDIA H100 NVL"
    pair = [h100(i, name=nvl, nvlink_links=18, nvlink_active=12) for i in range(2)]
    assert node_degraded(pair) == {}
    assert judge_all(pair, FAIL).exit_code == 0
    worn = [
        *pair,
        h100(2, name=nvl, nvlink_links=18, nvlink_active=8),
        h100(3, name=nvl, nvlink_links=18, nvlink_active=8),
    ]
    assert sorted(node_degraded(worn)) == [2, 3]
    sxm = [h100(i, nvlink_links=18, nvlink_active=12) for i in range(2)]
    assert sorted(node_degraded(sxm)) == [0, 1]


def test_a_lone_gpu_has_no_nvlink_finding_its_links_carry_nothing():
    assert node_degraded([h100(0, nvlink_links=18, nvlink_active=0)]) == {}
    assert node_degraded([h100(0, nvlink_links=18, nvlink_active=9)]) == {}
    assert node_degraded([h100(0, nvlink_links=18, nvlink_active=9, pcie_link_width=8)])[0][0].code == "pcie_width"


@pytest.mark.parametrize(
    ("name", "bridged"),
    [
        ("NVIDIA A40", True),
        ("NVIDIA RTX A6000", True),
        ("NVIDIA A100-PCIE-40GB", True),
        ("NVIDIA A100 80GB PCIe", True),
        ("NVIDIA H100 PCIe", True),
        ("NVIDIA H100 NVL", True),
        ("NVIDIA H200 NVL", True),
        ("NVIDIA A30", True),
        ("NVIDIA H100 80GB HBM3", False),
        ("NVIDIA H200", False),
        ("NVIDIA A100-SXM4-80GB", False),
        ("NVIDIA A400", False),
        ("", False),
        (None, False),
    ],
)
def test_bridged_cards_are_told_from_sxm_parts_by_name(name, bridged):
    assert bridged_card(name) is bridged


@pytest.mark.parametrize(
    ("mask", "temp", "codes"),
    [
        (0x8 | 0x40, 33, ["hw_thermal_slowdown"]),  # HW slowdown also set for the thermal slowdown: one cause
        (0x8 | 0x80, 33, ["hw_power_brake"]),
        (0x8 | 0x40 | 0x80, 33, ["hw_thermal_slowdown", "hw_power_brake"]),  # two causes, each once
        (0x8, 87, ["temperature"]),  # heat is the cause of the HW slowdown
        (0x40, 90, ["hw_thermal_slowdown"]),  # heat once, with the temperature in it
        (0x8, 33, ["hw_slowdown"]),  # neither bit names a cause: the slowdown itself
    ],
)
def test_one_cause_is_reported_once(mask, temp, codes):
    found = gpu_degraded(clocks(mask, temperature_c=temp))
    assert [d.code for d in found] == codes


def test_a_hot_gpu_in_hw_thermal_slowdown_names_both_in_one_finding():
    (found,) = gpu_degraded(clocks(0x48, temperature_c=90))
    assert found.text.endswith("temperature 90C at/above its slowdown threshold 87C")
    assert found.values == {"clock_event_reasons": "0x48", "temperature_c": 90, "slowdown_c": 87}


def test_a_slowdown_threshold_of_zero_or_unknown_is_no_temperature_rule():
    assert gpu_degraded(h100(0, temperature_c=50, temperature_slowdown_c=0)) == []
    assert gpu_degraded(h100(0, temperature_c=50, temperature_slowdown_c=None)) == []
    assert gpu_degraded(h100(0, temperature_c=None, temperature_slowdown_c=87)) == []
    assert [d.code for d in gpu_degraded(h100(0, temperature_c=88, temperature_slowdown_c=87))] == ["temperature"]


def test_an_x1_link_of_x16_is_narrow_and_an_unreported_width_is_not():
    (found,) = gpu_degraded(h100(0, pcie_link_width=1, pcie_link_width_max=16))
    assert found.values == {"width": 1, "max_width": 16}
    assert gpu_degraded(h100(0, pcie_link_width=0, pcie_link_width_max=16)) == []  # 0: not a reading
    assert gpu_degraded(h100(0, pcie_link_width=None, pcie_link_width_max=16)) == []
    assert gpu_degraded(h100(0, pcie_link_width=16, pcie_link_width_max=16)) == []


def test_a_node_of_exactly_two_gpus_compares_them():
    node = [h100(0, nvlink_links=18, nvlink_active=18), h100(1, nvlink_links=18, nvlink_active=12)]
    assert list(node_degraded(node)) == [1]
    node = [h100(0, nvlink_links=18, nvlink_active=18), h100(1, nvlink_links=18, nvlink_active=None)]
    assert node_degraded(node) == {}  # an unread state is not down


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


# --- mutation-found blind spots (issue 18 item 14) ---------------------------------------------------------------


def test_gpu_degraded_alone_is_off_by_default_and_a_partly_trained_link_is_found():
    (found,) = gpu_degraded(h100(0, nvlink_links=18, nvlink_active=17))
    assert (found.code, found.text) == ("nvlink_down", "NVLink 17 of 18 links active")
    assert gpu_degraded(h100(0, nvlink_links=18, nvlink_active=17), alone=True) == []


def test_one_link_up_of_eighteen_is_some_up_and_some_down():
    node = [h100(0, nvlink_links=18, nvlink_active=18), h100(1, nvlink_links=18, nvlink_active=1)]
    assert node_degraded(node)[1][0].text == "NVLink 1 of 18 links active"


def test_the_peer_finding_is_an_nvlink_finding():
    node = [h100(0, nvlink_links=18, nvlink_active=18), h100(1, nvlink_links=12, nvlink_active=12)]
    (found,) = node_degraded(node)[1]
    assert found.code == "nvlink_down" and found.text.endswith("other GPUs of this model have 18 up")


def test_a_bridged_card_reporting_fewer_links_than_its_peers_have_up_is_compared():
    a40 = "NVIDIA A40"
    node = [h100(0, name=a40, nvlink_links=4, nvlink_active=4), h100(1, name=a40, nvlink_links=2, nvlink_active=2)]
    assert node_degraded(node)[1][0].values == {"active": 2, "links": 2, "peer_links": 4}


def test_unread_or_inconsistent_link_states_never_raise():
    node = [
        h100(0, nvlink_links=18, nvlink_active=18),
        h100(1, nvlink_links=18, nvlink_active=None),  # its state could not be read
        h100(2, nvlink_links=18, nvlink_active=12),
        h100(3, nvlink_links=None, nvlink_active=2),  # no link count but a state: not judged
    ]
    assert list(node_degraded(node)) == [2]


def test_the_thermal_finding_text_without_heat_and_a_threshold_of_one_degree():
    (found,) = gpu_degraded(clocks(0x40))
    assert found.text == "hardware thermal slowdown while idle (HW thermal)"
    assert found.values == {"clock_event_reasons": "0x40"}
    assert [d.code for d in gpu_degraded(h100(0, temperature_c=1, temperature_slowdown_c=1))] == ["temperature"]


def test_a_gpu_judged_without_peers_has_no_nvlink_comparison_and_unknown_reasons_read_zero():
    assert gpu_degraded(h100(0, nvlink_links=18, nvlink_active=18)) == []  # no peer given: nothing to compare
    (found,) = gpu_degraded(h100(0, clock_event_reasons=None, clock_event_names=("hw_power_brake",)))
    assert found.values == {"clock_event_reasons": "0x0"}

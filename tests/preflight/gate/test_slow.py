"""Slow GPUs: the relative check against the node's median and the per-model floors (gate/slow.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podguard.preflight.gate.degraded import Degraded
from podguard.preflight.gate.slow import FLOORS, METRICS, h2d_floor, model_floors, slow_findings

H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
HEALTHY_H200 = {"matmul_tflops": 790.0, "mem_gbps": 4200.0, "h2d_gbps": 55.0}


def _node(count: int, model: str = H200, **overrides: dict[str, float]) -> tuple[dict, dict]:
    """`count` GPUs measuring HEALTHY_H200; overrides["gpu3"] = {"mem_gbps": 1.0} changes GPU 3's metrics."""
    metrics = {i: {**HEALTHY_H200, **overrides.get(f"gpu{i}", {})} for i in range(count)}
    return metrics, dict.fromkeys(range(count), model)


def test_one_gpu_at_65_percent_of_the_median_is_slow() -> None:
    metrics, models = _node(8, gpu5={"matmul_tflops": 0.65 * 790})  # 513.5: above the H200 floor (480)
    found = slow_findings(metrics, models, 0.8)
    assert list(found) == [5]
    (finding,) = found[5]
    assert isinstance(finding, Degraded) and finding.code == "slow"
    assert finding.values["metric"] == "matmul_tflops"
    assert finding.values["value"] == pytest.approx(513.5)
    assert finding.values["median"] == pytest.approx(790.0)
    assert finding.values["ratio"] == 0.8
    assert finding.text == "matmul_tflops 514 TFLOP/s is below 0.8 x the median of 8 GPUs (790 TFLOP/s)"


def test_all_within_5_percent_is_not_slow() -> None:
    metrics = {i: {k: v * (0.95 + 0.01 * i) for k, v in HEALTHY_H200.items()} for i in range(8)}  # 95 % .. 102 %
    assert slow_findings(metrics, dict.fromkeys(range(8), H200), 0.8) == {}


def test_the_ratio_is_honoured() -> None:
    metrics, models = _node(4, gpu1={"mem_gbps": 0.85 * 4200})
    assert slow_findings(metrics, models, 0.8) == {}
    found = slow_findings(metrics, models, 0.9)
    assert [f.values["metric"] for f in found[1]] == ["mem_gbps"]
    assert "below 0.9 x the median of 4 GPUs" in found[1][0].text
    assert slow_findings(metrics, models, 0) == {}  # 0: no relative check (and the floor is not reached)


def test_every_metric_is_judged_on_its_own() -> None:
    metrics, models = _node(3, gpu0={"h2d_gbps": 10.0}, gpu2={"mem_gbps": 3000.0, "matmul_tflops": 400.0})
    found = slow_findings(metrics, models, 0.8, links=dict.fromkeys(range(3), (5, 16)))
    assert {i: sorted(f.values["metric"] for f in fs) for i, fs in found.items()} == {
        0: ["h2d_gbps"],  # below the Gen5 x16 link's floor (23.9)
        2: ["matmul_tflops", "matmul_tflops", "mem_gbps"],  # matmul: relative and below the H200 floor
    }


def test_a_copy_speed_set_by_the_host_is_never_compared_with_other_gpus() -> None:
    """Two RTX 4090s on Gen4 x8 slots beside six on x16 copy at half the speed, healthy: only the link floor
    judges h2d_gbps (the host's link and NUMA placement set it, not the GPU)."""
    metrics = {i: {"h2d_gbps": 25.0 if i < 6 else 12.8} for i in range(8)}
    links = {i: (4, 16 if i < 6 else 8) for i in range(8)}
    assert slow_findings(metrics, dict.fromkeys(range(8), "NVIDIA GeForce RTX 4090"), 0.8, links=links) == {}
    metrics[7] = {"h2d_gbps": 4.0}  # below the x8 link's floor (6.0): caught
    found = slow_findings(metrics, dict.fromkeys(range(8), "NVIDIA GeForce RTX 4090"), 0.8, links=links)
    assert list(found) == [7] and "floor" in found[7][0].text


def test_equally_slow_gpus_are_caught_by_the_model_floor() -> None:
    metrics = {i: {"matmul_tflops": 300.0, "mem_gbps": 4200.0, "h2d_gbps": 55.0} for i in range(8)}
    found = slow_findings(metrics, dict.fromkeys(range(8), H100), 0.8)
    assert sorted(found) == list(range(8))
    for findings in found.values():
        (finding,) = findings
        assert finding.values == {"metric": "matmul_tflops", "value": 300.0, "floor": 480, "model": "H100 SXM"}
        assert finding.text == "matmul_tflops 300 TFLOP/s is below the floor 480 TFLOP/s for H100 SXM GPUs"


def test_unknown_model_gets_the_relative_check_only() -> None:
    slow_everywhere = {"matmul_tflops": 1.0, "mem_gbps": 1.0, "h2d_gbps": 1.0}
    metrics = {0: dict(slow_everywhere), 1: dict(slow_everywhere), 2: {**slow_everywhere, "mem_gbps": 0.5}}
    found = slow_findings(metrics, dict.fromkeys(range(3), "NVIDIA Future GPU 9000"), 0.8)
    assert list(found) == [2]
    assert [f.values["metric"] for f in found[2]] == ["mem_gbps"]
    assert "median" in found[2][0].values
    assert slow_findings(metrics, {}, 0.8).keys() == {2}  # no model known at all: the same


def test_a_single_gpu_gets_the_floors_only() -> None:
    assert slow_findings({0: HEALTHY_H200}, {0: H200}, 0.8) == {}
    found = slow_findings({0: {**HEALTHY_H200, "mem_gbps": 1000.0}}, {0: H200}, 1.0)
    (finding,) = found[0]
    assert finding.values == {"metric": "mem_gbps", "value": 1000.0, "floor": 2900, "model": "H200"}
    assert slow_findings({0: {"mem_gbps": 1.0}}, {0: "NVIDIA Future GPU 9000"}, 0.8) == {}


def test_floors_differ_per_model() -> None:
    a6000 = {"matmul_tflops": 140.0, "mem_gbps": 680.0, "h2d_gbps": 24.0}  # a healthy RTX A6000
    assert slow_findings({0: a6000}, {0: "NVIDIA RTX A6000"}, 0.8) == {}
    found = slow_findings({0: a6000}, {0: "NVIDIA A100-SXM4-80GB"}, 0.8)
    assert [f.values["metric"] for f in found[0]] == ["matmul_tflops", "mem_gbps"]
    assert {f.values["model"] for f in found[0]} == {"A100 SXM 80GB"}


def test_the_all_reduce_floor_applies_to_every_gpu_and_has_no_relative_check() -> None:
    metrics, models = _node(4)
    for i, per_gpu in metrics.items():
        per_gpu["allreduce_busbw_gbps"] = 120.0 if i else 100.0  # node-level; unequal only to prove no median
    found = slow_findings(metrics, models, 0.9)
    assert sorted(found) == [0, 1, 2, 3]
    assert all([f.values["metric"] for f in fs] == ["allreduce_busbw_gbps"] for fs in found.values())
    assert "(the node's all-reduce bus bandwidth) is below the floor 300 GB/s for H200 GPUs" in found[0][0].text
    metrics = {i: {**HEALTHY_H200, "allreduce_busbw_gbps": 100.0} for i in range(2)}
    assert slow_findings(metrics, dict.fromkeys(range(2), "NVIDIA L40S"), 0.8) == {}  # PCIe cards: no floor


def test_values_that_are_not_measurements_are_ignored() -> None:
    metrics = {
        0: {"matmul_tflops": 700.0, "matmul_dtype": "bfloat16", "latency_ms": 9.0},  # type: ignore[dict-item]
        1: {"matmul_tflops": float("nan"), "latency_ms": 1.0},
        2: {"matmul_tflops": 690.0, "mem_gbps": True, "latency_ms": 1.0},  # type: ignore[dict-item]
    }
    assert slow_findings(metrics, {}, 0.8) == {}  # latency is not a probe metric; NaN and bools are not numbers


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan"), "0.8"])
def test_a_bad_ratio_is_refused(ratio: object) -> None:
    with pytest.raises(ValueError, match="slow ratio"):
        slow_findings({}, {}, ratio)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA RTX A4000", None),
        ("NVIDIA GH200 480GB", None),
        ("", None),
    ],
)
def test_models_are_matched_by_nvml_name(name: str, model: str | None) -> None:
    entry = model_floors(name)
    assert (entry.model if entry else None) == model


def test_the_floor_table_is_consistent() -> None:
    for entry in FLOORS:
        assert set(entry.floors) <= set(METRICS), entry.model
        assert all(value > 0 for value in entry.floors.values()), entry.model
        assert model_floors("NVIDIA " + entry.model) == entry  # each entry is reachable past the ones before it


# --- issue 18: floors that hold on every host, per-model medians, MIG slices ------------------------------------

GEN5_X16, GEN4_X16 = (5, 16), (4, 16)


@pytest.mark.parametrize(
    ("gen", "width", "floor"),
    [(5, 16, 23.9), (4, 16, 12.0), (3, 16, 6.0), (4, 8, 6.0), (5, 8, 12.0), (6, 16, 46.0), (1, 1, 0.1), (2, 4, 0.8)],
)
def test_the_copy_floor_follows_the_host_link(gen: int, width: int, floor: float) -> None:
    assert h2d_floor(gen, width) == floor


@pytest.mark.parametrize(("gen", "width"), [(None, 16), (5, None), (0, 16), (7, 16), (5, 0), (5, -1), (True, 16)])
def test_no_copy_floor_when_nvml_does_not_say_what_the_link_is(gen: object, width: object) -> None:
    assert h2d_floor(gen, width) is None  # type: ignore[arg-type]


def test_an_h100_pcie_in_a_gen4_server_measuring_22_to_26_passes_and_a_gen5_host_at_that_speed_does_not() -> None:
    healthy = {"matmul_tflops": 600.0, "mem_gbps": 1900.0}
    metrics = {i: {**healthy, "h2d_gbps": h2d} for i, h2d in enumerate((22.0, 24.5, 26.0, 23.0))}
    models = dict.fromkeys(range(4), "NVIDIA H100 PCIe")
    assert slow_findings(metrics, models, 0.8, links=dict.fromkeys(range(4), GEN4_X16)) == {}
    found = slow_findings(metrics, models, 0.8, links=dict.fromkeys(range(4), GEN5_X16))
    assert sorted(found) == [0, 3]  # 22 and 23 GB/s on a Gen5 x16 link: below its 23.9 GB/s floor
    (finding,) = found[0]
    assert finding.values == {
        "metric": "h2d_gbps",
        "value": 22.0,
        "floor": 23.9,
        "pcie_gen_max": 5,
        "pcie_width_max": 16,
    }
    assert finding.text == "h2d_gbps 22.0 GB/s is below the floor 23.9 GB/s for a PCIe gen 5 x16 host link"


def test_a_copy_just_at_the_floor_passes_and_just_below_fails() -> None:
    at = slow_findings({0: {"h2d_gbps": 12.0}}, {0: "NVIDIA A40"}, 0.8, links={0: GEN4_X16})
    below = slow_findings({0: {"h2d_gbps": 11.9}}, {0: "NVIDIA A40"}, 0.8, links={0: GEN4_X16})
    assert at == {} and [f.values["floor"] for f in below[0]] == [12.0]


def test_no_copy_floor_without_the_link_whatever_the_model() -> None:
    assert slow_findings({0: {"h2d_gbps": 1.0}}, {0: H200}, 0.8) == {}
    assert slow_findings({0: {"h2d_gbps": 1.0}}, {0: H200}, 0.8, links={0: (None, None)}) == {}


def test_the_relative_check_is_judged_per_model() -> None:
    """An H100 PCIe beside three H100 SXM is not slow because the SXM parts are faster (issue 18)."""
    sxm = {"matmul_tflops": 790.0, "mem_gbps": 3000.0}
    pcie = {"matmul_tflops": 600.0, "mem_gbps": 1900.0}
    metrics = {0: sxm, 1: dict(sxm), 2: dict(sxm), 3: pcie}
    models = {0: H100, 1: H100, 2: H100, 3: "NVIDIA H100 PCIe"}
    assert slow_findings(metrics, models, 0.8) == {}
    metrics[4] = {"matmul_tflops": 380.0, "mem_gbps": 1900.0}  # a second PCIe card, far slower than the first
    models[4] = "NVIDIA H100 PCIe"
    found = slow_findings(metrics, models, 0.8)
    relative = [f for f in found[4] if "median" in f.values]
    assert [(f.values["metric"], f.values["gpus"]) for f in relative] == [("matmul_tflops", 2)]
    assert relative[0].values["median"] == 490.0


def test_a_node_of_exactly_two_gpus_compares_them_against_their_mean() -> None:
    metrics = {0: {"matmul_tflops": 700.0}, 1: {"matmul_tflops": 460.0}}  # threshold 0.8 * 580 = 464
    found = slow_findings(metrics, {0: "X", 1: "X"}, 0.8)
    assert list(found) == [1] and found[1][0].values["threshold"] == pytest.approx(464.0)
    metrics[1]["matmul_tflops"] = 470.0  # threshold 0.8 * 585 = 468: above it
    assert slow_findings(metrics, {0: "X", 1: "X"}, 0.8) == {}


def test_a_mig_slice_is_never_held_to_a_whole_gpus_floors() -> None:
    one_g = {"matmul_tflops": 95.0, "mem_gbps": 400.0, "h2d_gbps": 5.0}  # a healthy 1g.10gb slice of an H100
    assert slow_findings({0: one_g}, {0: H100}, 0.8, links={0: GEN5_X16}, mig={0: "MIG 9856 MiB"}) == {}
    found = slow_findings({0: one_g}, {0: H100}, 0.8, links={0: GEN5_X16})
    assert sorted(f.values["metric"] for f in found[0]) == ["h2d_gbps", "matmul_tflops", "mem_gbps"]  # as a whole GPU


def test_mig_slices_are_compared_only_with_slices_of_their_profile() -> None:
    small, big = {"matmul_tflops": 95.0}, {"matmul_tflops": 380.0}
    metrics = {0: small, 1: big, 2: dict(big)}
    models = dict.fromkeys(range(3), H100)
    mig = {0: "MIG 9856 MiB", 1: "MIG 40192 MiB", 2: "MIG 40192 MiB"}
    assert slow_findings(metrics, models, 0.8, mig=mig) == {}
    metrics[3], models[3], mig[3] = {"matmul_tflops": 40.0}, H100, "MIG 9856 MiB"
    assert list(slow_findings(metrics, models, 0.8, mig=mig)) == [3]
    whole = {4: {"matmul_tflops": 790.0}, 5: {"matmul_tflops": 100.0}}  # a whole GPU is not a slice's peer
    assert 4 not in slow_findings({0: small, **whole}, dict.fromkeys((0, 4, 5), H100), 0.8, mig={0: "MIG 1"})


def test_a_ratio_of_zero_turns_the_relative_check_off_but_not_the_floors() -> None:
    metrics, models = _node(4, gpu1={"matmul_tflops": 100.0})
    found = slow_findings(metrics, models, 0)
    assert [f.values for f in found[1]] == [{"metric": "matmul_tflops", "value": 100.0, "floor": 480, "model": "H200"}]
    assert list(slow_findings(metrics, models, 1.0)) == [1]  # 1: anything below the median


def test_bool_and_nan_metrics_are_not_measurements() -> None:
    metrics = {0: {"matmul_tflops": True}, 1: {"matmul_tflops": float("nan")}, 2: {"matmul_tflops": -1.0}}
    assert slow_findings(metrics, dict.fromkeys(range(3), H200), 0.8) == {}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slow ratio"):
        slow_findings({}, {}, True)  # type: ignore[arg-type]


def _docs_floor_table() -> dict[str, dict[str, float | None]]:
    """The floor table of docs/gate.md ("Floors and where they come from"): the cited source of FLOORS."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "gate.md").read_text()
    section = text.split("### Floors and where they come from", 1)[1]
    table = section[section.index("\n| model (NVML name)") + 1 :].split("\n\n", 1)[0]  # the first table only
    rows = [line.strip().strip("|").split("|") for line in table.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0]]
    out: dict[str, dict[str, float | None]] = {}
    for cells in rows[1:]:
        row = dict(zip(header, (cell.strip() for cell in cells), strict=True))
        model = row["model (NVML name)"].split(" (", 1)[0]
        floors = {metric: row[f"`{metric}` floor"] for metric in ("matmul_tflops", "mem_gbps", "allreduce_busbw_gbps")}
        out[model] = {k: None if v in ("—", "") else float(v) for k, v in floors.items()}
    return out


def test_every_floor_in_the_code_is_the_one_docs_gate_md_gives_with_its_source() -> None:
    documented = _docs_floor_table()
    assert set(documented) == {entry.model for entry in FLOORS}
    for entry in FLOORS:
        expected = {k: v for k, v in documented[entry.model].items() if v is not None}
        assert dict(entry.floors) == expected, entry.model


# --- mutation-found blind spots (issue 18 item 14) ---------------------------------------------------------------


def test_findings_come_out_in_gpu_order_whatever_metric_found_them():
    metrics = {
        0: dict(HEALTHY_H200),
        1: {**HEALTHY_H200, "mem_gbps": 2000.0},
        3: {**HEALTHY_H200, "matmul_tflops": 300.0},
    }
    found = slow_findings(metrics, dict.fromkeys(metrics, H200), 0.8)
    assert list(found) == [1, 3]  # matmul (GPU 3) is judged before memory (GPU 1)


def test_relative_memory_findings_say_gb_per_s():
    metrics, models = _node(4, gpu2={"mem_gbps": 3000.0})
    (finding,) = [f for f in slow_findings(metrics, models, 0.8)[2] if "median" in f.values]
    assert finding.text == "mem_gbps 3000 GB/s is below 0.8 x the median of 4 GPUs (4200 GB/s)"


def test_a_value_of_exactly_100_is_written_without_decimals_and_zero_is_a_measurement():
    (finding,) = slow_findings({0: {"matmul_tflops": 100.0}}, {0: H200}, 0.8)[0]
    assert finding.code == "slow"
    assert finding.text == "matmul_tflops 100 TFLOP/s is below the floor 480 TFLOP/s for H200 GPUs"
    (zero,) = slow_findings({0: {"matmul_tflops": 0.0}}, {0: H200}, 0.8)[0]
    assert zero.values["value"] == 0.0  # a GPU that measured nothing is below every floor


def test_text_and_infinite_metrics_are_not_measurements():
    metrics = {0: {"matmul_tflops": "fast"}, 1: {"matmul_tflops": float("inf")}, 2: {"matmul_tflops": 700.0}}
    assert slow_findings(metrics, dict.fromkeys(range(3), "X"), 0.8) == {}  # type: ignore[arg-type]


def test_a_bool_link_width_is_no_link():
    assert h2d_floor(5, True) is None  # type: ignore[arg-type]


def test_two_slow_gpus_of_one_model_are_both_named_in_order_and_a_float_generation_is_no_link():
    metrics, models = _node(6, gpu4={"matmul_tflops": 300.0}, gpu1={"matmul_tflops": 310.0})
    found = slow_findings(metrics, models, 0.8)
    assert list(found) == [1, 4]
    assert all(any("median" in f.values for f in found[i]) for i in (1, 4))
    assert h2d_floor(5.0, 16) is None  # type: ignore[arg-type]

"""`--degraded exclude` as a pure decision (preflight/exclusion.py): which GPUs are left, whether they still meet
NPROC_PER_NODE and the expected count, and what the run is told (the end-to-end runs: tests/cli/test_cli_degraded.py).
"""

from __future__ import annotations

import pytest

from fakes import FakeBackend
from podguard.errors import UsageError
from podguard.gpu.selected import SelectedGpu, Selection
from podguard.preflight.exclusion import exclude_degraded
from podguard.preflight.gate.degraded import Degraded
from podguard.preflight.gate.rules import GpuVerdict, Verdict
from podguard.preflight.options import OnFewer
from podguard.preflight.selection import select_gpus

NVLINK = "NVLink 17 of 18 links active"
HOT = "temperature 87C at/above its slowdown threshold 87C"
EXPECTED_2 = "the expected 2 GPUs (RUNPOD_GPU_COUNT / --expect-gpus)"


def node(count: int, *, expected: int | None = None, gpus: tuple[int, ...] | None = None) -> Selection:
    """A selection of `gpus` (default: all) on a node of `count` GPUs."""
    chosen = tuple(SelectedGpu(i, f"GPU-{i:04d}", f"GPU-{i:04d}", "NVIDIA H100") for i in gpus or range(count))
    return Selection(chosen, "all" if gpus is None else "GPU_LIST", count, expected)


def degraded(index: int, *texts: str) -> GpuVerdict:
    findings = tuple(Degraded("nvlink_down" if "NVLink" in t else "temperature", t) for t in texts or (NVLINK,))
    return GpuVerdict(index, f"GPU-{index:04d}", Verdict.EXCLUDED, degraded=findings)


def exclude(selection, *excluded, nproc=None, on_fewer=OnFewer.FAIL):
    return exclude_degraded(selection, excluded, nproc_per_node=nproc, on_fewer=on_fewer)


def test_the_rest_runs_and_the_summary_names_what_was_excluded_and_why():
    sel = node(8)
    out = exclude(sel, degraded(6))
    assert out.selection == Selection(sel.gpus[:6] + sel.gpus[7:], "all", 8, None)
    assert out.message == ""
    assert out.warnings == (f"excluded degraded GPU(s) 6 (GPU6 {NVLINK}); running on GPU(s) 0,1,2,3,4,5,7",)


def test_only_the_gpu_list_changes_source_count_and_expectation_stay():
    sel = node(8, expected=7, gpus=(1, 3, 5))
    out = exclude(sel, degraded(3))
    assert out.selection == Selection((sel.gpus[0], sel.gpus[2]), "GPU_LIST", 8, 7)


def test_two_gpu_node_without_nproc_runs_on_the_other_gpu():
    out = exclude(node(2), degraded(1, HOT))
    assert out.selection is not None and out.selection.indices == (0,)
    assert out.warnings == (f"excluded degraded GPU(s) 1 (GPU1 {HOT}); running on GPU(s) 0",)


def test_nproc_met_exactly_by_what_is_left_runs():
    out = exclude(node(2), degraded(1), nproc="1")
    assert out.selection is not None and out.selection.indices == (0,)
    assert len(out.warnings) == 1 and "FEWER" not in out.warnings[0]


def test_nproc_the_rest_still_exceeds_runs():
    out = exclude(node(8), degraded(0), nproc=" 4 ")
    assert out.selection is not None and out.selection.indices == (1, 2, 3, 4, 5, 6, 7)
    assert out.warnings == (f"excluded degraded GPU(s) 0 (GPU0 {NVLINK}); running on GPU(s) 1,2,3,4,5,6,7",)


def test_two_gpu_node_with_nproc_2_is_69_naming_nproc():
    out = exclude(node(2), degraded(1), nproc="2")
    assert out.selection is None and out.warnings == ()
    said = f"excluded degraded GPU(s) 1 (GPU1 {NVLINK})"
    assert out.message == f"{said}: 1 GPU(s) left, fewer than NPROC_PER_NODE=2 needs"


def test_two_gpu_node_with_nproc_2_continues_loudly_when_asked():
    out = exclude(node(2), degraded(0), nproc="2", on_fewer=OnFewer.CONTINUE)
    assert out.selection is not None and out.selection.indices == (1,)
    assert out.message == ""
    assert out.warnings == (
        "FEWER GPUS THAN EXPECTED: NPROC_PER_NODE=2; continuing with 1 (--on-fewer-gpus continue)",
        f"excluded degraded GPU(s) 0 (GPU0 {NVLINK}); running on GPU(s) 1",
    )


def test_as_the_selection_makes_it_nproc_capped_at_4_of_8_is_not_backfilled():
    sel = select_gpus([FakeBackend.healthy(8).snapshot(i) for i in range(8)], nproc_per_node="4")
    assert sel.indices == (0, 1, 2, 3)
    out = exclude(sel, degraded(2), nproc="4")
    assert out.selection is None
    assert out.message.endswith(": 3 GPU(s) left, fewer than NPROC_PER_NODE=4 needs")
    kept = exclude(sel, degraded(2), nproc="4", on_fewer=OnFewer.CONTINUE)
    assert kept.selection is not None and kept.selection.indices == (0, 1, 3)


def test_expected_count_still_met_by_the_node_less_the_excluded_runs():
    out = exclude(node(2, expected=1), degraded(1))
    assert out.selection is not None and out.selection.indices == (0,)
    assert len(out.warnings) == 1


def test_expected_count_no_longer_met_is_69_naming_it():
    out = exclude(node(2, expected=2), degraded(0))
    assert out.selection is None
    assert out.message == f"excluded degraded GPU(s) 0 (GPU0 {NVLINK}): 1 GPU(s) left, fewer than {EXPECTED_2} needs"


def test_expected_count_is_compared_with_the_node_not_with_what_is_left_of_the_selection():
    # GPU_LIST=0,1,2 on an 8-GPU pod of RUNPOD_GPU_COUNT=6: the node still has 7 good GPUs, so the pod is what was
    # rented; 2 selected GPUs are left.
    out = exclude(node(8, expected=6, gpus=(0, 1, 2)), degraded(1))
    assert out.selection is not None and out.selection.indices == (0, 2)
    assert len(out.warnings) == 1
    # ...and a node that is short of the expectation fails even when the selection is small
    out = exclude(node(8, expected=8, gpus=(0, 1, 2)), degraded(1))
    assert out.selection is None and "fewer than the expected 8 GPUs" in out.message


def test_expected_zero_or_none_asks_for_nothing():
    for expected in (0, None):
        out = exclude(node(2, expected=expected), degraded(0))
        assert out.selection is not None and out.selection.indices == (1,)


def test_both_short_names_both():
    out = exclude(node(2, expected=2), degraded(1), nproc="2")
    assert out.selection is None
    assert out.message.endswith(f": 1 GPU(s) left, fewer than NPROC_PER_NODE=2 and {EXPECTED_2} needs")
    kept = exclude(node(2, expected=2), degraded(1), nproc="2", on_fewer=OnFewer.CONTINUE)
    assert kept.selection is not None and kept.selection.indices == (0,)
    assert kept.warnings[0] == (
        f"FEWER GPUS THAN EXPECTED: NPROC_PER_NODE=2 and {EXPECTED_2}; continuing with 1 (--on-fewer-gpus continue)"
    )


@pytest.mark.parametrize("on_fewer", [OnFewer.FAIL, OnFewer.CONTINUE])
def test_nothing_left_is_69_even_with_continue(on_fewer):
    out = exclude(node(1), degraded(0), on_fewer=on_fewer)
    assert out.selection is None and out.warnings == ()
    assert out.message == f"excluded degraded GPU(s) 0 (GPU0 {NVLINK}): 0 GPU(s) left, nothing to run on"


def test_nothing_left_with_a_count_asked_names_the_count_even_with_continue():
    out = exclude(node(2), degraded(0), degraded(1), nproc="2", on_fewer=OnFewer.CONTINUE)
    assert out.selection is None
    assert out.message.endswith(": 0 GPU(s) left, fewer than NPROC_PER_NODE=2 needs")


def test_several_excluded_ids_sorted_reasons_in_gate_order():
    # indices 9 and 2 on a 16-GPU node: a set of them does not iterate in sorted order
    out = exclude(node(16), degraded(9, NVLINK, HOT), degraded(2, HOT))
    assert out.selection is not None
    assert out.selection.indices == (0, 1, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15)
    assert out.warnings == (
        f"excluded degraded GPU(s) 2,9 (GPU9 {NVLINK}, {HOT}; GPU2 {HOT}); "
        "running on GPU(s) 0,1,3,4,5,6,7,8,10,11,12,13,14,15",
    )


def test_the_rest_keeps_the_selection_order():
    out = exclude(node(16, gpus=(12, 3, 9, 1)), degraded(9))
    assert out.selection is not None and out.selection.indices == (12, 3, 1)
    assert out.warnings[-1].endswith("; running on GPU(s) 1,3,12")


@pytest.mark.parametrize("nproc", ["0", "two", "-1"])
def test_a_bad_nproc_per_node_is_a_usage_error_naming_it(nproc):
    with pytest.raises(UsageError, match=r"^NPROC_PER_NODE="):
        exclude(node(2), degraded(1), nproc=nproc)


def test_an_empty_nproc_per_node_is_unset():
    out = exclude(node(2), degraded(1), nproc="")
    assert out.selection is not None and out.selection.indices == (0,)

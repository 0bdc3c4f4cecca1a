"""GPU selection: precedence, UUIDs and MIG ids, caps, expected counts, and every bad input -> exit 64."""

from __future__ import annotations

import pytest

from fakes import FakeBackend, h100
from podguard.errors import PodguardError, UsageError
from podguard.gpu.backend import MigDevice
from podguard.preflight.selection import select_gpus


def inventory(count: int = 8):
    backend = FakeBackend.healthy(count)
    return [backend.snapshot(i) for i in range(count)]


def test_all_gpus_by_default_children_see_uuids_in_pci_order():
    sel = select_gpus(inventory(4))
    assert sel.indices == (0, 1, 2, 3)
    env = sel.child_env()
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == [g.uuid for g in inventory(4)]
    assert sel.child_env_for(2)["CUDA_VISIBLE_DEVICES"] == inventory(4)[2].uuid


def test_gpu_list_indices_and_uuids_and_precedence_over_cuda_visible_devices():
    inv = inventory(8)
    sel = select_gpus(inv, gpu_list=f"4, {inv[6].uuid}", cuda_visible_devices="0,1")
    assert sel.indices == (4, 6)
    assert sel.source == "GPU_LIST"
    assert any("precedence" in w for w in sel.warnings)


def test_cuda_visible_devices_uuid_prefix_like_cuda():
    inv = inventory(8)
    sel = select_gpus(inv, cuda_visible_devices=inv[3].uuid[:-3] + "003")
    assert sel.indices == (3,)


def test_cuda_visible_devices_empty_means_cpu_only():
    sel = select_gpus(inventory(2), cuda_visible_devices="")
    assert sel.cpu_only and sel.child_env() == {"CUDA_VISIBLE_DEVICES": ""}


def test_nproc_per_node_caps_the_selection():
    sel = select_gpus(inventory(8), nproc_per_node="4")
    assert sel.indices == (0, 1, 2, 3)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpu_list": "0,8"}, "GPU index 8 does not exist; this node has 8 GPUs (valid indices: 0-7"),
        ({"gpu_list": "1,1"}, "listed twice"),
        ({"gpu_list": "0,,1"}, "empty entry"),
        ({"gpu_list": "zero"}, "'zero' is not a GPU index or UUID"),
        ({"gpu_list": "GPU-deadbeef"}, "no GPU with UUID 'GPU-deadbeef'"),
        ({"gpu_list": "GPU-0"}, "matches 8 GPUs"),
        ({"gpu_list": "MIG-1234"}, "MIG device 'MIG-1234' is not on this node"),
        ({"cuda_visible_devices": "0,-2"}, "GPU index -2 does not exist"),
        ({"nproc_per_node": "eight"}, "NPROC_PER_NODE='eight' is not a whole number"),
        ({"nproc_per_node": "0"}, "NPROC_PER_NODE=0 is out of range"),
        ({"expect_gpus": "-1"}, "expect-gpus=-1 is out of range"),
        ({"on_fewer": "maybe"}, "on-fewer-gpus='maybe' is not valid; choose one of: fail, continue"),
    ],
)
def test_bad_input_is_exit_64_naming_the_value(kwargs, needle):
    with pytest.raises(PodguardError) as err:
        select_gpus(inventory(8), **kwargs)
    assert err.value.code == 64
    assert needle in err.value.message
    assert "\n" not in err.value.message


def test_fewer_gpus_than_expected_fails_69_or_continues_loudly():
    with pytest.raises(PodguardError) as err:
        select_gpus(inventory(4), expect_gpus="8")
    assert err.value.code == 69 and "expected 8 GPUs but this node has 4" in err.value.message
    sel = select_gpus(inventory(4), expect_gpus="8", on_fewer="continue")
    assert sel.indices == (0, 1, 2, 3)
    assert any("FEWER GPUS THAN EXPECTED" in w for w in sel.warnings)


def test_nproc_above_selection_is_the_hardcoded_seven_gpus_case():
    with pytest.raises(PodguardError) as err:
        select_gpus(inventory(4), nproc_per_node="7")
    assert err.value.code == 69 and "NPROC_PER_NODE=7 but only 4" in err.value.message
    assert select_gpus(inventory(4), nproc_per_node="7", on_fewer="continue").indices == (0, 1, 2, 3)


def test_no_gpu_falls_back_to_cpu_unless_required():
    sel = select_gpus([])
    assert sel.cpu_only and any("CPU only" in w for w in sel.warnings)
    for kwargs in ({"require_gpu": True}, {"gpu_list": "0"}, {"expect_gpus": "1"}):
        with pytest.raises(PodguardError) as err:
            select_gpus([], **kwargs)
        assert err.value.code == 69


def test_mig_gpu_expands_to_its_mig_devices_and_mig_ids_select_one():
    migs = (MigDevice("MIG-aaaa-1111"), MigDevice("MIG-aaaa-2222"))
    inv = [h100(0, mig_enabled=True, mig_devices=migs), h100(1)]
    sel = select_gpus(inv)
    assert [g.visible_id for g in sel.gpus] == ["MIG-aaaa-1111", "MIG-aaaa-2222", inv[1].uuid]
    one = select_gpus(inv, cuda_visible_devices="MIG-aaaa-2222")
    assert [(g.index, g.visible_id) for g in one.gpus] == [(0, "MIG-aaaa-2222")]


def test_gpu_list_minus_one_on_a_gpu_node_is_loud_and_require_gpu_refuses_it():
    """Issue 7: GPU_LIST=-1 means "no GPU"; on a node that has GPUs that must be said, naming the variable."""
    inv = FakeBackend.healthy(8).gpus
    sel = select_gpus(inv, gpu_list="-1")
    assert sel.cpu_only
    (warning,) = sel.warnings
    assert "GPU_LIST='-1' selects no GPU although this node has 8" in warning
    with pytest.raises(UsageError) as info:
        select_gpus(inv, gpu_list="-1", require_gpu=True)
    assert info.value.code == 64 and "GPU_LIST='-1'" in info.value.message and "--require-gpu" in info.value.message
    assert select_gpus([], gpu_list="-1").cpu_only  # a CPU node: nothing to warn about beyond "no GPU"


def test_the_run_summary_prints_the_gpu_list_warning(nvml_node, tmp_path):
    from podguard.preflight.options import PreflightOptions, ProbeMode
    from podguard.preflight.pipeline import run_preflight

    opts = PreflightOptions(command="run", gpu_list="-1", probe=ProbeMode.OFF, state_dir=tmp_path / "state")
    result = run_preflight(opts)
    assert result.exit_code == 0 and result.selection is not None and result.selection.cpu_only
    assert "! GPU_LIST='-1' selects no GPU although this node has 8" in result.summary

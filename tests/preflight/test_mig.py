"""Issue 7 item 3: MIG slices are separate GPUs for cleanup, the gate and leases.

The fake NVML lists processes per MIG device handle; as in an unprivileged container, the MIG parent
answers NO_PERMISSION for its memory and process lists. Every slice's process holds the same
/dev/nvidia0, so the device files cannot tell the slices apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakenvml import NvmlNode, mig_unprivileged, pid_alive
from podguard.errors import PodguardError
from podguard.gpu.selected import SelectedGpu
from podguard.preflight.leases import acquire_gpus
from podguard.preflight.options import PreflightOptions, ProbeMode
from podguard.preflight.pipeline import run_preflight


def _preflight(node: NvmlNode, gpu_list: str, **changes: object):
    opts = PreflightOptions(
        command="run", gpu_list=gpu_list, probe=ProbeMode.OFF, dev_dir=node.dev_dir, grace_s=1.0, **changes
    )
    return run_preflight(opts)


def test_a_run_on_one_mig_slice_stops_only_that_slices_holders(cli_node: NvmlNode) -> None:
    sc = cli_node.write(mig_unprivileged(gpu=0, devices=2, count=2))
    _slice0, slice1 = (m.uuid for m in sc.gpus[0].mig_devices)
    other_run = cli_node.spawn_holder(0, 4096, mig=0)  # another job, on slice 0
    leftover = cli_node.spawn_holder(0, 4096, mig=1)  # a leftover on our slice
    fd_only = cli_node.spawn_holder(0, 1024, mig=1, register=False)  # /dev/nvidia0 open, listed nowhere
    result = _preflight(cli_node, slice1, busy_timeout_s=3.0)
    assert result.exit_code == 0, result.summary
    assert not pid_alive(leftover.pid)
    assert pid_alive(other_run.pid), "a run on MIG slice 1 stopped a process on slice 0"
    assert pid_alive(fd_only.pid), "killed on device-file evidence alone on a MIG-enabled GPU"
    report = json.loads(Path(result.report_path).read_text())
    assert [k["pid"] for k in report["cleanup"]["killed"]] == [leftover.pid]
    assert {s["pid"]: s["code"] for s in report["cleanup"]["skipped"]}.get(fd_only.pid) == "fd_only"
    assert report["gate"]["verdicts"][0]["verdict"] == "healthy"  # judged by its MIG device, not the parent


def test_a_busy_mig_slice_is_busy_and_an_idle_one_passes(cli_node: NvmlNode) -> None:
    sc = cli_node.write(mig_unprivileged(gpu=0, devices=2, count=2))
    slice0, slice1 = (m.uuid for m in sc.gpus[0].mig_devices)
    cli_node.spawn_holder(0, 4096, mig=0, name="sshd")  # protected: never stopped
    assert _preflight(cli_node, slice1, busy_timeout_s=0.3).exit_code == 0
    busy = _preflight(cli_node, slice0, busy_timeout_s=0.3)
    assert busy.exit_code == 75 and "GPU(s) 0 still busy" in busy.message


HOLD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from podguard.preflight.leases import acquire_gpus
    from podguard.gpu.selected import SelectedGpu
    index, uuid, visible = sys.argv[2], sys.argv[3], sys.argv[4]
    with acquire_gpus([SelectedGpu(int(index), uuid, visible)], explicit=True, lease_dir=Path(sys.argv[1]),
                      command="podguard train -- python job.py"):
        print("held", flush=True)
        sys.stdin.read()
    """
)

CARD = "GPU-11111111-2222-3333-4444-555555555555"
MIG_A = "MIG-aaaaaaaa-0000-0000-0000-000000000001"
MIG_B = "MIG-aaaaaaaa-0000-0000-0000-000000000002"


@pytest.mark.parametrize(("first", "second"), [(MIG_A, CARD), (CARD, MIG_A)])
def test_a_mig_lease_and_a_whole_gpu_lease_on_the_same_card_conflict(tmp_path: Path, first: str, second: str) -> None:
    lease_dir = tmp_path / "leases"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lease_dir), "0", CARD, first],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(PodguardError) as info:
            acquire_gpus([SelectedGpu(0, CARD, second)], explicit=True, lease_dir=lease_dir)
        assert info.value.code == 75 and f"pid {holder.pid}" in info.value.message
        if first == MIG_A:  # another slice of the same card is still free
            with acquire_gpus([SelectedGpu(0, CARD, MIG_B)], explicit=True, lease_dir=lease_dir) as lease:
                assert lease.held
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    with acquire_gpus([SelectedGpu(0, CARD, second)], explicit=True, lease_dir=lease_dir) as lease:
        assert lease.held  # free once the first run is gone

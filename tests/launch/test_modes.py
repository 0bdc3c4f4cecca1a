"""Launch modes: single, per-gpu (GPU and CPU-only), auto, --only-gpu, prefix formats, the defaults every job gets
(line-buffered C stdio, rich's TTY switches)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from podguard.errors import UsageError
from podguard.gpu.selected import SelectedGpu, Selection
from podguard.launch.job_env import _stdbuf_lib, job_env, line_buffering_env, progress_bar_env
from podguard.launch.line_shims import cxx_shim, perl_dir
from podguard.launch.modes import only_for_gpu, per_gpu_specs, pick_mode, single_spec, validate_mode
from podguard.launch.run import run_job

PY = sys.executable


def _selection(indices=(0, 1, 2, 3)) -> Selection:
    gpus = tuple(SelectedGpu(i, f"GPU-{i:08d}", f"GPU-{i:08d}", "H100") for i in indices)
    return Selection(gpus=gpus, source="GPU_LIST", inventory_count=8)


CPU = Selection(gpus=(), source="none", inventory_count=0)


def test_single_sees_exactly_the_selected_gpus_by_uuid(tmp_path: Path):
    spec = single_spec(["python", "serve.py"], _selection((2, 5)), log_dir=tmp_path)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "GPU-00000002,GPU-00000005"
    assert spec.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert spec.log_path == tmp_path / "job.log" and spec.gpus == (2, 5)
    assert single_spec(["x"], CPU).env["CUDA_VISIBLE_DEVICES"] == ""


def test_per_gpu_env_prefix_and_logs(tmp_path: Path):
    specs = per_gpu_specs(["python", "train.py"], _selection((1, 3, 4)), master_port=29600, log_dir=tmp_path)
    assert [s.name for s in specs] == ["GPU1", "GPU3", "GPU4"]
    assert [s.prefix for s in specs] == ["GPU1:", "GPU3:", "GPU4:"]
    second = specs[1].env
    assert second["CUDA_VISIBLE_DEVICES"] == "GPU-00000003"
    assert (second["RANK"], second["LOCAL_RANK"], second["WORLD_SIZE"], second["LOCAL_WORLD_SIZE"]) == (
        "1",
        "1",
        "3",
        "3",
    )
    assert (second["MASTER_ADDR"], second["MASTER_PORT"]) == ("127.0.0.1", "29600")
    assert specs[2].log_path == tmp_path / "GPU4.log" and specs[2].gpus == (4,)
    assert specs[1].label == "GPU3 (rank 1)"


def test_per_gpu_multi_node_ranks_and_custom_prefix():
    specs = per_gpu_specs(
        ["t"], _selection((0, 1)), master_port="1234", node_rank=1, nnodes=2, prefix_format="[rank{rank}] "
    )
    assert [s.env["RANK"] for s in specs] == ["2", "3"] and specs[0].env["WORLD_SIZE"] == "4"
    assert [s.prefix for s in specs] == ["[rank2] ", "[rank3] "]


def test_per_gpu_on_a_cpu_only_node_runs_nproc_cpu_workers():
    specs = per_gpu_specs(["t"], CPU, master_port=29500, nproc=2)
    assert [(s.name, s.prefix, s.env["CUDA_VISIBLE_DEVICES"]) for s in specs] == [
        ("CPU0", "CPU0:", ""),
        ("CPU1", "CPU1:", ""),
    ]
    assert len(per_gpu_specs(["t"], CPU, master_port=29500)) == 1


def test_mig_slices_of_one_gpu_get_distinct_names():
    gpus = (SelectedGpu(0, "GPU-a", "MIG-1"), SelectedGpu(0, "GPU-a", "MIG-2"))
    specs = per_gpu_specs(["t"], Selection(gpus=gpus, source="all", inventory_count=1), master_port=1)
    assert [s.name for s in specs] == ["GPU0.0", "GPU0.1"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["MIG-1", "MIG-2"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prefix_format": "{host}:"}, r"unknown field \{host\}"),
        ({"prefix_format": "{gpu"}, "not a valid format"),
        ({"master_port": 0}, "MASTER_PORT=0"),
        ({"master_port": "abc"}, "MASTER_PORT='abc'"),
        ({"node_rank": 2, "nnodes": 2}, "node rank 2"),
    ],
)
def test_per_gpu_bad_input(kwargs, match):
    args = {"master_port": 29500, **kwargs}
    with pytest.raises(UsageError, match=match):
        per_gpu_specs(["t"], _selection(), **args)


def test_only_gpu_filter():
    specs = per_gpu_specs(["t"], _selection((0, 2)), master_port=1)
    assert only_for_gpu(specs, 2) == {"GPU2"}
    with pytest.raises(UsageError, match="no worker runs on GPU 5; valid: 0, 2"):
        only_for_gpu(specs, "5")
    with pytest.raises(UsageError, match="expected a GPU index"):
        only_for_gpu(specs, "x")
    assert only_for_gpu(per_gpu_specs(["t"], CPU, master_port=1, nproc=2), 1) == {"CPU1"}
    with pytest.raises(UsageError, match="use per-gpu or roles"):
        only_for_gpu([single_spec(["t"], _selection())], 0)


@pytest.mark.parametrize(
    ("argv", "gpus", "mode"),
    [
        (["python", "train.py"], 4, "torchrun"),
        (["python3.11", "-u", "-X", "dev", "train.py"], 2, "torchrun"),
        (["train.py", "--lr", "1"], 2, "torchrun"),
        (["python", "-m", "pkg.train"], 8, "torchrun"),
        (["python", "train.py"], 1, "single"),
        (["python", "train.py"], 0, "single"),
        (["python", "-c", "print(1)"], 4, "single"),
        (["torchrun", "--nproc-per-node", "4", "train.py"], 4, "single"),
        (["python", "-m", "torch.distributed.run", "train.py"], 4, "single"),
        (["bash", "run.sh"], 4, "single"),
    ],
)
def test_auto_mode(argv, gpus, mode):
    choice = pick_mode(argv, _selection(tuple(range(gpus))))
    assert choice.mode == mode
    assert choice.reason.startswith(f"mode auto -> {mode}: ")


def test_validate_mode():
    assert validate_mode("per-gpu") == "per-gpu"
    with pytest.raises(UsageError, match="choose one of: auto, single, per-gpu, torchrun, roles"):
        validate_mode("pergpu")


def test_per_gpu_job_runs_with_isolated_gpus_and_logs(tmp_path: Path):
    code = (
        "import os\n"
        "print(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'], "
        "os.environ['CUDA_VISIBLE_DEVICES'], os.environ['MASTER_PORT'])"
    )
    specs = per_gpu_specs([PY, "-c", code], _selection((0, 1, 2)), master_port=29555, log_dir=tmp_path)
    out = io.BytesIO()
    outcome = run_job(specs, terminal=out, only=only_for_gpu(specs, 1), summary=False)
    assert outcome.exit_code == 0
    assert out.getvalue() == b"GPU1:1 1 3 GPU-00000001 29555\n"  # --only-gpu 1 on the terminal
    assert (tmp_path / "GPU2.log").read_text() == "2 2 3 GPU-00000002 29555\n"  # every log file complete


def test_importing_the_launch_modules_does_not_import_torch():
    code = (
        "import sys\n"
        "import podguard.launch.modes, podguard.launch.supervisor, podguard.job.restart_guard\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    assert subprocess.run([PY, "-c", code], check=False).returncode == 0


# --- issue 23: line-buffered C stdio and rich's TTY switches for every job ---------------------------------------


def test_every_job_gets_line_buffered_c_stdio_after_the_users_preload_unless_told_otherwise(monkeypatch):
    lib = _stdbuf_lib()
    if lib is None:
        pytest.skip("coreutils' libstdbuf.so is not installed here")
    for var in ("LD_PRELOAD", "_STDBUF_O", "ASAN_OPTIONS", "PODGUARD_LINE_BUFFERING"):
        monkeypatch.delenv(var, raising=False)
    shim = f":{cxx_shim()}" if cxx_shim() is not None else ""  # issue 30: C++'s own buffer (line_shims.py)
    perl = {"PERL5OPT": "-MPodguardAutoflush", "PERL5LIB": str(perl_dir())} if perl_dir() is not None else {}
    env = single_spec(["./native"], _selection(())).env
    assert env["LD_PRELOAD"] == lib + shim and env["_STDBUF_O"] == "L"
    assert env["ASAN_OPTIONS"] == "verify_asan_link_order=0"  # a gcc ASan build would refuse to start
    assert per_gpu_specs(["./native"], _selection((0, 1)), master_port=29500)[1].env["_STDBUF_O"] == "L"
    user = {"LD_PRELOAD": "/usr/lib/libjemalloc.so", "ASAN_OPTIONS": "detect_leaks=0"}
    assert line_buffering_env(user) == {
        "LD_PRELOAD": f"/usr/lib/libjemalloc.so:{lib}{shim}",  # the user's own preload stays first
        "_STDBUF_O": "L",
        "ASAN_OPTIONS": "detect_leaks=0:verify_asan_link_order=0",
        **perl,
    }
    assert line_buffering_env({"_STDBUF_O": "0"}) == {}  # the user chose a buffering: theirs
    assert line_buffering_env({"PODGUARD_LINE_BUFFERING": "0"}) == {}
    assert line_buffering_env({"LD_PRELOAD": lib}) == {}


def test_rich_is_told_its_output_takes_redraws_unless_the_user_said_otherwise():
    assert progress_bar_env({}) == {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    assert progress_bar_env({"TTY_COMPATIBLE": "0"}) == {} and progress_bar_env({"TTY_INTERACTIVE": "0"}) == {}
    code = "from rich.console import Console; c = Console(); print(c.is_terminal, c.is_interactive)"
    pytest.importorskip("rich")
    env = {**job_env(1), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]  # on a pipe: rich's live displays (Lightning's bar) now draw

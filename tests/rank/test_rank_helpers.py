"""The helpers imported inside training processes: init_rank, memory phase logging,
the NaN guard (2 real gloo ranks) and presets/config files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loopback import free_port
from podguard.errors import PodguardError, UsageError
from podguard.rank import build_config, load_config_file, log_memory, preset, read_dist_env, resolve_device_index
from podguard.rank.init import claim_cuda_device, is_busy_error
from podguard.rank.memlog import read_host_memory

pytestmark = pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")  # CPU torch without numpy

BUSY = "CUDA error: CUDA-capable device(s) is/are busy or unavailable"


def _py(code: str, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


# --------------------------------------------------------------------------------------------------
# import cost


def test_importing_the_helpers_does_not_import_torch() -> None:
    code = (
        "import sys, podguard.rank, podguard.rank.init, podguard.launch.prepare, podguard.demo, "
        "podguard.preflight.gate.probe; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --------------------------------------------------------------------------------------------------
# distributed env and device mapping


def test_dist_env_defaults_to_a_single_process() -> None:
    env = read_dist_env({})
    assert (env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port) == (0, 0, 1, None, None)


def test_dist_env_reads_the_launcher_variables() -> None:
    env = read_dist_env(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    )
    assert (env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port) == (3, 1, 4, "10.0.0.1", 29500)
    assert read_dist_env({"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "a", "MASTER_PORT": "1"}).local_rank == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x"}, "RANK='x' is not an integer"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 is out of range"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is out of range"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2 is out of range"),
        ({"WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "MASTER_ADDR not set"),
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT not set"),
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is out of range"),
    ],
)
def test_bad_dist_env_is_a_clear_usage_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        read_dist_env(env)


def test_local_rank_past_the_visible_gpus_names_everything() -> None:
    with pytest.raises(UsageError) as info:
        resolve_device_index(3, 2, {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_WORLD_SIZE": "4"})
    msg = info.value.message
    assert "LOCAL_RANK=3" in msg and "only 2 GPU(s)" in msg and "CUDA_VISIBLE_DEVICES='0,1'" in msg
    assert "valid LOCAL_RANK: 0..1" in msg


def test_device_index_rules() -> None:
    assert resolve_device_index(1, 4, {})[0] == 1
    # podguard's per-gpu mode: each worker sees only its GPU (by UUID) -> cuda:0 whatever LOCAL_RANK is
    per_gpu = {"CUDA_VISIBLE_DEVICES": "GPU-abc", "LOCAL_WORLD_SIZE": "8", "PODGUARD_WORKER": "GPU5"}
    assert resolve_device_index(5, 1, per_gpu)[0] == 0
    # ... but torchrun squeezing two ranks onto one GPU is an error
    with pytest.raises(UsageError, match="LOCAL_RANK=1"):
        resolve_device_index(
            1, 1, {"CUDA_VISIBLE_DEVICES": "GPU-abc", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
        )
    # two GPUs listed but only one visible (one is broken/missing): not isolation, an error
    with pytest.raises(UsageError, match="LOCAL_RANK=1"):
        resolve_device_index(1, 1, {"CUDA_VISIBLE_DEVICES": "0,1"})
    # an explicit index from the launcher wins, and is checked too
    assert resolve_device_index(6, 2, {"PODGUARD_CUDA_DEVICE": "1"}) == (1, "PODGUARD_CUDA_DEVICE=1")
    with pytest.raises(UsageError, match="PODGUARD_CUDA_DEVICE=2"):
        resolve_device_index(0, 2, {"PODGUARD_CUDA_DEVICE": "2"})
    with pytest.raises(PodguardError) as info:
        resolve_device_index(0, 0, {"CUDA_VISIBLE_DEVICES": ""})
    assert info.value.code == 69


class _FakeCuda:
    """Enough of `torch` for claim_cuda_device: fails with the given errors, then succeeds."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.cuda = SimpleNamespace(set_device=lambda i: None, synchronize=lambda i: None)

    def empty(self, *_: Any, **__: Any) -> None:
        self.calls += 1
        if self.errors:
            raise RuntimeError(self.errors.pop(0))


def test_busy_gpu_is_retried_once_after_a_short_backoff() -> None:
    fake = _FakeCuda([BUSY])
    start = time.monotonic()
    claim_cuda_device(fake, 0, backoff_s=0.1)
    assert fake.calls == 2
    assert 0.09 <= time.monotonic() - start < 0.6


def test_busy_twice_raises_and_other_errors_are_not_retried() -> None:
    fake = _FakeCuda([BUSY, BUSY])
    with pytest.raises(RuntimeError, match="busy"):
        claim_cuda_device(fake, 0, backoff_s=0.0)
    assert fake.calls == 2
    fake = _FakeCuda(["CUDA error: uncorrectable ECC error encountered"])
    with pytest.raises(RuntimeError, match="ECC"):
        claim_cuda_device(fake, 0, backoff_s=0.0)
    assert fake.calls == 1
    assert is_busy_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"))
    assert not is_busy_error(RuntimeError("invalid device ordinal"))


# --------------------------------------------------------------------------------------------------
# init_rank in this process (imports torch: marked slow)


@pytest.fixture
def single_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PODGUARD_CUDA_DEVICE", raising=False)


@pytest.mark.slow
@pytest.mark.usefixtures("single_env")
def test_init_rank_single_process_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    from podguard.rank import init_rank

    ctx = init_rank()
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.device, ctx.backend) == (0, 0, 1, "cpu", "gloo")
    assert ctx.is_main and not ctx.distributed and not ctx.cpu_fallback
    ctx.shutdown()  # no process group: a no-op
    out = capsys.readouterr().out
    assert "[rank 0] INIT: local_rank=0 world_size=1 device=cpu backend=gloo" in out


@pytest.mark.slow
@pytest.mark.usefixtures("single_env")
def test_init_rank_requiring_cuda_fails_or_falls_back_loudly(capsys: pytest.CaptureFixture[str]) -> None:
    from podguard.rank import init_rank

    with pytest.raises(PodguardError) as info:
        init_rank(device="cuda")
    assert info.value.code == 69 and "CUDA is not available" in info.value.message
    ctx = init_rank(device="cuda", allow_cpu_fallback=True)
    assert ctx.device == "cpu" and ctx.cpu_fallback and ctx.backend == "gloo"
    out = capsys.readouterr().out
    assert "WARNING: FALLING BACK TO CPU" in out and "(CPU FALLBACK)" in out


@pytest.mark.slow
@pytest.mark.usefixtures("single_env")
def test_init_rank_gpu_paths_with_a_simulated_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU branch on a CPU machine: torch is told it has 2 GPUs, the device claim is simulated."""
    import torch

    import podguard.rank.init as init_mod

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(UsageError, match=r"LOCAL_RANK=3 but only 2 GPU\(s\) are visible"):
        init_mod.init_rank()

    monkeypatch.setenv("LOCAL_RANK", "1")
    claims: list[int] = []

    def busy(torch_mod: Any, index: int, **_: Any) -> None:
        claims.append(index)
        raise RuntimeError(BUSY)

    monkeypatch.setattr(init_mod, "claim_cuda_device", busy)
    with pytest.raises(PodguardError) as info:
        init_mod.init_rank()
    assert info.value.code == 75 and "busy" in info.value.message and claims == [1]
    ctx = init_mod.init_rank(allow_cpu_fallback=True)
    assert ctx.device == "cpu" and ctx.cpu_fallback

    def broken(torch_mod: Any, index: int, **_: Any) -> None:
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(init_mod, "claim_cuda_device", broken)
    with pytest.raises(PodguardError) as info:
        init_mod.init_rank()
    assert info.value.code == 76

    # a distributed run cannot quietly mix a CPU rank into an nccl group
    monkeypatch.setattr(init_mod, "claim_cuda_device", busy)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    with pytest.raises(PodguardError, match="cannot fall back to CPU in a distributed run") as info:
        init_mod.init_rank(allow_cpu_fallback=True)
    assert info.value.code == 75  # the cause (busy) decides the code


def test_init_rank_argument_checks() -> None:
    from podguard.rank import init_rank

    with pytest.raises(UsageError, match="backend='mpi'"):
        init_rank(backend="mpi")
    with pytest.raises(UsageError, match="device='tpu'"):
        init_rank(device="tpu")
    with pytest.raises(UsageError, match="nccl"):
        init_rank(backend="nccl", device="cpu")
    with pytest.raises(UsageError, match="retry_backoff_s"):
        init_rank(retry_backoff_s=10)


# --------------------------------------------------------------------------------------------------
# memory phases


def test_log_memory_prints_one_line_per_phase(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "5")
    sample = log_memory("post import")
    out = capsys.readouterr().out.strip()
    assert out.startswith("[rank 5] MEM:POST-IMPORT rss=") and "rss_peak=" in out
    assert sample.rss_bytes and sample.rss_bytes > 1 << 20
    assert sample.rss_peak_bytes and sample.rss_peak_bytes >= sample.rss_bytes
    if "torch" not in sys.modules or not sys.modules["torch"].cuda.is_initialized():
        assert "gpu_alloc" not in out and sample.gpu_allocated_bytes is None


def test_host_memory_without_proc(tmp_path: Path) -> None:
    assert read_host_memory(tmp_path / "missing") == (None, None)
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert read_host_memory(status) == (1024 * 1024, 2048 * 1024)


# --------------------------------------------------------------------------------------------------
# NaN guard: 2 real gloo ranks, only rank 1 sees the NaN

NAN_RANK = """
import json, os, sys, warnings
warnings.filterwarnings("ignore", message=".*NumPy.*")
import torch
from podguard.rank import NanGuard, NonFiniteError, init_rank
dump_dir, policy, bad_steps = sys.argv[1], sys.argv[2], {int(s) for s in sys.argv[3].split(",")}
ctx = init_rank(timeout_s=60)
model = torch.nn.Linear(3, 2)
guard = NanGuard(model, max_consecutive=2, dump_dir=dump_dir, policy=policy)
decisions, outcome, code = [], "finished", 0
try:
    for step in range(1, 8):
        nan_here = ctx.rank == 1 and step in bad_steps
        model.weight.grad = torch.zeros_like(model.weight)
        if nan_here:
            model.weight.grad[0, 0] = float("nan")
        loss = torch.tensor(float("nan") if nan_here else 1.0)
        decisions.append([step, guard.check(step, loss, torch.tensor(0.5))])
except NonFiniteError as exc:
    outcome, code = f"stopped at {exc.step}", 3
print("RESULT " + json.dumps({"rank": ctx.rank, "decisions": decisions, "outcome": outcome}), flush=True)
ctx.shutdown()
sys.exit(code)
"""


def _run_ranks(tmp_path: Path, policy: str, bad: str, tag: str) -> list[subprocess.Popen[str]]:
    script = _py(NAN_RANK, tmp_path, "nan_rank.py")
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / tag), policy, bad],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        )
    return procs


def _collect(procs: list[subprocess.Popen[str]]) -> list[tuple[int, dict[str, Any], str]]:
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=120)
        line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
        assert line, text
        out.append((proc.returncode, json.loads(line[len("RESULT ") :]), text))
    return out


@pytest.mark.slow
def test_nan_guard_two_gloo_ranks_agree(tmp_path: Path) -> None:
    # both scenarios at once (4 processes) to keep the wall time down
    skip = _run_ranks(tmp_path, "skip", "2,4,5", "skip")
    stop = _run_ranks(tmp_path, "stop", "3", "stop")
    skip_results, stop_results = _collect(skip), _collect(stop)

    # policy skip, K=2: step 2 skipped by both, step 4 skipped by both, step 5 (2nd in a row) stops both
    for code, result, text in skip_results:
        assert code == 3, text
        assert result["decisions"] == [[1, True], [2, False], [3, True], [4, False]], text
        assert result["outcome"] == "stopped at 5"
    rank0_text = skip_results[0][2]
    assert "NAN-GUARD: step 2 non-finite on ranks [1]" in rank0_text and "skipping the step on all ranks" in rank0_text
    assert "stopping (2 consecutive bad steps)" in rank0_text
    dumps = sorted(p.name for p in (tmp_path / "skip").iterdir())
    assert dumps == [f"nonfinite-step{s:08d}-rank{r}.json" for s in (2, 4, 5) for r in (0, 1)]
    rank1 = json.loads((tmp_path / "skip" / "nonfinite-step00000002-rank1.json").read_text())
    assert rank1["loss"] == "nan" and rank1["grad_norm"] == "0.5" and rank1["bad_ranks"] == [1]
    assert rank1["this_rank_nonfinite"] and rank1["decision"] == "skip"
    assert rank1["nonfinite_gradients"] == [{"name": "weight", "nonfinite": 1, "numel": 6}]
    assert rank1["nonfinite_parameters"] == []
    rank0 = json.loads((tmp_path / "skip" / "nonfinite-step00000005-rank0.json").read_text())
    assert rank0["loss"] == "1" and not rank0["this_rank_nonfinite"] and rank0["decision"] == "stop"
    assert rank0["consecutive"] == 2

    # policy stop: both stop at the first bad step, which only rank 1 saw
    for code, result, text in stop_results:
        assert code == 3, text
        assert result["decisions"] == [[1, True], [2, True]]
        assert result["outcome"] == "stopped at 3"
    assert sorted(p.name for p in (tmp_path / "stop").iterdir()) == [
        "nonfinite-step00000003-rank0.json",
        "nonfinite-step00000003-rank1.json",
    ]


@pytest.mark.slow
def test_nan_guard_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from podguard.rank import NanGuard, NonFiniteError

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    model = torch.nn.Linear(2, 2)
    guard = NanGuard(model, max_consecutive=3, dump_dir=tmp_path, log=False)
    assert guard.check(1, 0.5, None)
    assert guard.check(2, torch.tensor(1e300, dtype=torch.float64), 1.0)  # large but finite: no false alarm
    assert not guard.check(3, float("inf"), 1.0)
    assert not guard.check(4, 1.0, float("nan"))
    assert guard.check(5, 1.0, 1.0) and guard.consecutive == 0
    assert guard.skipped_steps == [3, 4]
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    for step in (6, 7):
        assert not guard.check(step, torch.tensor(float("nan")), None)
    with pytest.raises(NonFiniteError) as info:
        guard.check(8, torch.tensor(float("nan")), None)
    assert info.value.step == 8 and info.value.dump_path == tmp_path / "nonfinite-step00000008-rank0.json"
    dump = json.loads(info.value.dump_path.read_text())
    assert dump["nonfinite_parameters"] == [{"name": "weight", "nonfinite": 1, "numel": 4}]
    assert dump["loss"] == "nan" and dump["grad_norm"] is None


def test_nan_guard_bad_arguments() -> None:
    from podguard.rank import NanGuard

    with pytest.raises(UsageError, match="policy='pause'"):
        NanGuard(None, policy="pause")
    with pytest.raises(UsageError, match="max_consecutive=0"):
        NanGuard(None, max_consecutive=0)


# --------------------------------------------------------------------------------------------------
# presets and config files


def test_presets() -> None:
    assert preset("ci").steps <= 500 and preset("ci").layers <= 4
    debug = preset("debug")
    assert debug.layers == 2 and debug.steps == 10 and debug.log_every == 1 and debug.nan_policy == "stop"
    assert preset("production").steps == 10000
    with pytest.raises(UsageError, match="preset 'fast' is not valid; valid presets: ci, debug, production"):
        preset("fast")


def test_config_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('preset = "debug"\nsteps = 20\nlr = 0.01\n')
    config = build_config(None, cfg, {"steps": 30, "batch_size": None})
    assert (config.preset, config.steps, config.lr, config.batch_size) == ("debug", 30, 0.01, 16)
    assert build_config("ci", cfg).preset == "ci"  # an explicit preset beats the file's
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"steps": 7, "nan_policy": "stop"}))
    assert load_config_file(js) == {"steps": 7, "nan_policy": "stop"}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.json", '{"stpes": 10}', "unknown key 'stpes' (did you mean 'steps'?)"),
        ("a.json", '{"steps": "ten"}', "steps='ten' is not valid; it must be an integer >= 1"),
        ("a.json", '{"steps": true}', "steps=True is not valid"),
        ("a.json", '{"lr": -1}', "lr=-1 is not valid; it must be a number > 0"),
        ("a.json", '{"nan_policy": "ignore"}', "nan_policy='ignore' is not valid; valid: skip, stop"),
        ("a.json", '{"preset": "huge"}', "preset='huge' is not valid; valid: ci, debug, production"),
        ("a.json", "[1, 2]", "the top level must be an object"),
        ("a.json", "{nope", "is not valid JSON"),
        ("a.toml", "steps = [", "is not valid TOML"),
        ("a.yaml", "steps: 1", "unsupported type '.yaml'"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        build_config(None, path)
    assert message in info.value.message
    assert str(path) in info.value.message
    assert "\n" not in info.value.message


def test_missing_config_file_and_bad_overrides(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        build_config(None, tmp_path / "none.json")
    with pytest.raises(UsageError, match="option: batch_size=0"):
        build_config(None, None, {"batch_size": 0})
    with pytest.raises(UsageError, match="larger than the dataset"):
        build_config(None, None, {"batch_size": 100000})

"""The node's all-reduce probe (probe/allreduce.py): real torch.distributed child processes, gloo on the CPU in CI,
bus bandwidth as nccl-tests computes it, timeouts that leave no process behind."""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from podguard.errors import UsageError
from podguard.preflight.gate.probe.allreduce import AllreduceResult, bus_bandwidth, run_allreduce

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch without numpy warns at import
        import torch
    return bool(torch.cuda.is_available())


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The probe's temp dir (its FileStore, the ranks' output) under tmp_path: the ranks' command lines name
    it, so this test finds exactly its own processes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def test_bus_bandwidth_as_nccl_tests_computes_it() -> None:
    assert bus_bandwidth(8_000_000_000, 1.0, 8) == (8.0, 14.0)  # busbw = algbw x 2(n-1)/n
    assert bus_bandwidth(1_000_000_000, 0.5, 2) == (2.0, 2.0)
    with pytest.raises(ValueError):
        bus_bandwidth(1, 0.0, 2)


def test_one_gpu_is_skipped_with_the_reason() -> None:
    result = run_allreduce([(3, "GPU-x")], timeout_s=5)
    assert result.ok and result.skipped and result.busbw_gbps is None
    assert result.reason == "one GPU selected: no all-reduce to measure"
    assert run_allreduce([], timeout_s=5).skipped


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, "timeout"),
        ({"backend": "mpi"}, "backend 'mpi'"),
        ({"nbytes": 6}, "multiple of 4"),
        ({"targets": [(1, "a"), (1, "b")]}, "listed twice"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs: dict, message: str) -> None:
    args = {"targets": [(0, "a"), (1, "b")], "timeout_s": 5, **kwargs}
    with pytest.raises(UsageError, match=message):
        run_allreduce(**args)


@needs_torch
def test_gloo_all_reduce_across_two_processes(private_tmp: Path) -> None:
    result = run_allreduce([(4, "GPU-a"), (6, "GPU-b")], timeout_s=120, backend="gloo", nbytes=1 << 20, target_s=0.05)
    assert isinstance(result, AllreduceResult)
    assert result.ok, result.reason
    assert not result.skipped and result.reason == "" and result.gpus == (4, 6)
    assert result.busbw_gbps is not None and result.algbw_gbps is not None
    assert result.busbw_gbps > 0
    assert result.busbw_gbps == pytest.approx(result.algbw_gbps, abs=0.02)  # two ranks: 2(n-1)/n = 1
    assert result.duration_ms > 0
    assert result.to_dict()["busbw_gbps"] == result.busbw_gbps
    assert _processes_mentioning(str(private_tmp)) == []
    assert list(private_tmp.iterdir()) == []  # the store and the outputs are gone


@needs_torch
def test_a_timeout_kills_every_rank(private_tmp: Path) -> None:
    started = time.monotonic()
    # 200 all-reduces of 64 MiB over loopback take far longer than the 3 s allowed
    result = run_allreduce([(0, "a"), (1, "b")], timeout_s=3, backend="gloo", nbytes=64 << 20, target_s=600)
    elapsed = time.monotonic() - started
    assert not result.ok and result.busbw_gbps is None
    assert result.reason == "all-reduce across GPUs 0, 1 timed out after 3s"
    assert elapsed < 3 + 5, elapsed
    assert _processes_mentioning(str(private_tmp)) == []  # SIGKILLed process groups: nothing survives
    assert list(private_tmp.iterdir()) == []


@needs_torch
@pytest.mark.skipif(_cuda_available(), reason="this machine has CUDA: NCCL would work")
def test_a_failing_rank_fails_the_probe_at_once(private_tmp: Path) -> None:
    started = time.monotonic()
    result = run_allreduce([(0, "GPU-a"), (5, "GPU-b")], timeout_s=120, backend="nccl", nbytes=1 << 20)
    assert not result.ok and result.busbw_gbps is None
    pattern = r"all-reduce rank [01] \(GPU [05]\) failed: NCCL needs 2 visible GPUs, CUDA sees 0 \(torch .*\)"
    assert re.fullmatch(pattern, result.reason), result.reason
    assert time.monotonic() - started < 60  # the first failure ends it, not the timeout
    assert _processes_mentioning(str(private_tmp)) == []

"""The probe's measurements (probe/measure.py): FLOP and byte counts, the timing loop and the result checks on
CPU tensors (how CI runs them); the CUDA-only parts (CUDA events, pinned memory) where a GPU is present."""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*NumPy.*")
torch = pytest.importorskip("torch")

from podguard.preflight.gate.probe import measure  # noqa: E402
from podguard.preflight.gate.probe.measure import MeasureFailure  # noqa: E402

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")


def test_flop_and_byte_counts() -> None:
    assert measure.matmul_flop(8192) == 2 * 8192**3  # n*n outputs, each n multiplies and n adds
    assert measure.copy_bytes(1 << 30, same_memory=True) == 2 << 30  # device copy: read + write
    assert measure.copy_bytes(1 << 30, same_memory=False) == 1 << 30  # host to device: once over the link
    assert measure.per_second(measure.matmul_flop(8192), 0.0011, 1e12) == pytest.approx(999.5, rel=1e-3)
    assert measure.per_second(4e9, 2.0, 1e9) == 2.0
    with pytest.raises(MeasureFailure, match="clock or the device"):
        measure.per_second(1.0, 0.0, 1e9)


def test_timed_counts_every_call_on_the_wall_clock() -> None:
    calls: list[float] = []

    def work() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.01)

    seconds = measure.timed(work, 3, CPU)
    assert len(calls) == 3
    assert 0.03 <= seconds < 0.5


def test_throughput_warms_up_then_times_a_batch_of_the_target_length() -> None:
    calls = 0

    def work() -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.002)

    timing = measure.throughput(work, CPU, warmup_s=0.02, target_s=0.06)
    assert 0.002 <= timing.seconds < 0.02
    assert 2 <= timing.iterations <= 30  # ~0.06 / 0.002; fewer when the machine is slow
    assert calls >= timing.iterations + 2 + 2  # set-up call, estimate, at least one warm-up batch of 2


def test_throughput_bounds_the_iterations() -> None:
    assert measure.throughput(lambda: time.sleep(0.03), CPU, warmup_s=0, target_s=0.001).iterations == 2
    assert measure.throughput(lambda: None, CPU, warmup_s=0, target_s=10, max_iterations=50).iterations == 50


def test_matmul_on_cpu_tensors_is_measured_and_checked() -> None:
    result = measure.measure_matmul(CPU, n=128, warmup_s=0.01, target_s=0.03)
    assert result.dtype == "bfloat16" and result.n == 128
    assert result.tflops > 0 and result.iterations >= 2
    assert result.max_rel_err < measure.PRODUCT_TOLERANCE


def test_the_dtype_is_bf16_unless_the_gpu_lacks_it() -> None:
    assert measure.matmul_dtype(CPU) is torch.bfloat16
    if torch.cuda.is_available():
        expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        assert measure.matmul_dtype(torch.device("cuda:0")) is expected


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_correct_product_passes_the_check(dtype: str) -> None:
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(256, 256, generator=gen).to(getattr(torch, dtype))
    b = torch.randn(256, 256, generator=gen).to(getattr(torch, dtype))
    assert measure.check_product(a, b, a @ b) < measure.PRODUCT_TOLERANCE


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda c, a, b: c[17].zero_(), "row sums differ"),  # a lost row
        (lambda c, a, b: c.copy_(a @ b.T), "row sums differ"),  # the wrong product
        (lambda c, a, b: c.index_copy_(1, torch.tensor([3, 4]), c[:, [4, 3]]), "checked rows differ"),  # same sums
        (lambda c, a, b: c.view(-1)[1000].fill_(float("nan")), "NaN/Inf"),
    ],
)
def test_a_wrong_product_fails_the_check(corrupt, message: str) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(256, 256, generator=gen, dtype=torch.bfloat16)
    b = torch.randn(256, 256, generator=gen, dtype=torch.bfloat16)
    product = a @ b
    corrupt(product, a, b)
    with pytest.raises(MeasureFailure, match=message):
        measure.check_product(a, b, product)


def test_copies_on_cpu_are_measured_and_checked() -> None:
    mem = measure.measure_copy(CPU, nbytes=4 << 20, warmup_s=0.01, target_s=0.02)
    h2d = measure.measure_h2d(CPU, nbytes=4 << 20, warmup_s=0.01, target_s=0.02)
    assert mem.gbps > 0 and mem.nbytes == 4 << 20 and mem.iterations >= 2
    assert h2d.gbps > 0 and h2d.nbytes == 4 << 20


def test_the_copy_pattern_differs_between_blocks() -> None:
    buf = measure._pattern(3 * measure.PATTERN_BLOCK, CPU)
    blocks = buf.view(3, -1)
    assert not torch.equal(blocks[0], blocks[1]) and not torch.equal(blocks[1], blocks[2])
    assert int(blocks[0, 1]) == 1 and int(blocks[1, 0]) == 1  # (position mod 251) + block number
    with pytest.raises(ValueError, match="multiple of 4096"):
        measure.measure_copy(CPU, nbytes=1000)


def test_a_copy_that_changed_the_data_fails() -> None:
    src = measure._pattern(measure.PATTERN_BLOCK, CPU)
    dst = src.clone()
    dst[5] += 1
    with pytest.raises(MeasureFailure, match="did not reproduce its source"):
        measure._check_copy(src, dst, "device memory copy")


def test_measure_device_reports_the_probe_keys() -> None:
    metrics = measure.measure_device(CPU, n=64, copy_nbytes=1 << 20, h2d_nbytes=1 << 20)
    assert set(metrics) == {"matmul_tflops", "matmul_dtype", "mem_gbps", "h2d_gbps", "h2d_wait_ms"}
    assert all(float(metrics[k]) > 0 for k in ("matmul_tflops", "mem_gbps", "h2d_gbps"))


def test_host_link_lock_makes_probes_take_turns(tmp_path: Path) -> None:
    lock = tmp_path / "h2d.lock"
    spans: list[tuple[float, float, float]] = []

    def probe() -> None:
        with measure.host_link_lock(lock, wait_s=30) as waited:
            began = time.monotonic()
            time.sleep(0.1)
            spans.append((began, time.monotonic(), waited))

    threads = [threading.Thread(target=probe) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    spans.sort()
    assert len(spans) == 3
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), spans  # one at a time
    assert max(w for _, _, w in spans) >= 0.15  # the last one waited for two turns


def test_host_link_lock_gives_up_waiting_and_tolerates_a_bad_path(tmp_path: Path) -> None:
    lock = tmp_path / "h2d.lock"
    with measure.host_link_lock(lock), measure.host_link_lock(lock, wait_s=0.05) as waited:
        assert 0.05 <= waited < 5  # held elsewhere: measured anyway, after the wait
    with measure.host_link_lock(tmp_path / "no-such-dir" / "h2d.lock") as waited:
        assert waited == 0.0


def test_h2d_measures_inside_the_lock(tmp_path: Path) -> None:
    with measure.host_link_lock(tmp_path / "h2d.lock", wait_s=0.05):
        result = measure.measure_h2d(
            CPU, nbytes=1 << 20, warmup_s=0, target_s=0.01, lock=measure.host_link_lock(tmp_path / "h2d.lock", 0.2)
        )
    assert result.waited_s >= 0.2 and result.gbps > 0


@needs_cuda
def test_cuda_events_time_the_gpu() -> None:
    device = torch.device("cuda:0")
    x = torch.randn(2048, 2048, device=device)
    seconds = measure.timed(lambda: x @ x, 5, device)
    assert 0 < seconds < 5


@needs_cuda
def test_gpu_measurements_are_plausible() -> None:
    device = torch.device("cuda:0")
    metrics = measure.measure_device(device, n=4096, copy_nbytes=256 << 20, h2d_nbytes=64 << 20)
    assert float(metrics["matmul_tflops"]) > 1
    assert float(metrics["mem_gbps"]) > float(metrics["h2d_gbps"]) > 0.5  # device memory beats the host link


@needs_cuda
def test_the_cuda_child_reports_its_metrics() -> None:
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "podguard.preflight.gate.probe.cuda_child"], capture_output=True, text=True, timeout=120
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ok"], report
    assert {"matmul_tflops", "mem_gbps", "h2d_gbps", "matmul_dtype"} <= set(report)

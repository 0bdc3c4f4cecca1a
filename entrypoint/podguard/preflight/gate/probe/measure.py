"""What one device can do, measured: a checked matmul (TFLOP/s), a device-memory copy (GB/s), a host→device
copy (GB/s). Imported only inside probe children (it imports torch).

    m = measure_matmul(torch.device("cuda:0"))          # MatmulMeasure(tflops=790.2, dtype="bfloat16", ...)
    copy_gbps = measure_copy(torch.device("cuda:0")).gbps

Device-agnostic on purpose: the arithmetic (FLOP and byte counts), the timing loop and the result checks run
the same on CPU tensors, which is how CI tests them; the CUDA-only parts are the clock (CUDA events) and the
pinned host buffer. Every measurement runs a warm-up first (kernel selection, clocks ramping up), then a
timed batch sized to a target duration, so a slow GPU does not take longer than a fast one by much.
Why these three and what the numbers mean: docs/gate.md ("Probe metrics").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

__all__ = [
    "CopyMeasure",
    "MatmulMeasure",
    "MeasureFailure",
    "Timing",
    "check_product",
    "copy_bytes",
    "host_link_lock",
    "matmul_dtype",
    "matmul_flop",
    "measure_copy",
    "measure_device",
    "measure_h2d",
    "measure_matmul",
    "per_second",
    "throughput",
    "timed",
]

PRODUCT_TOLERANCE = 1e-2  # bf16/fp16 output rounding is <= 2**-8 relative; a fault is orders of magnitude larger
CHECKED_ROWS = 16
PATTERN_BLOCK = 4096


class MeasureFailure(Exception):
    """A measurement's result was wrong (the device computed or copied garbage): the device is unhealthy."""


@dataclass(frozen=True)
class Timing:
    seconds: float  # per iteration
    iterations: int  # in the timed batch


@dataclass(frozen=True)
class MatmulMeasure:
    tflops: float
    dtype: str  # "bfloat16" | "float16" | ...
    n: int  # n x n times n x n
    iterations: int
    max_rel_err: float  # of the checked rows against an fp32 reference


@dataclass(frozen=True)
class CopyMeasure:
    gbps: float  # 1e9 bytes per second
    nbytes: int  # buffer size
    iterations: int
    waited_s: float = 0.0  # for the host link: time spent waiting for the other probes' turns


# -- arithmetic ----------------------------------------------------------------------------------------


def matmul_flop(n: int) -> int:
    """Floating-point operations of an n x n by n x n product: n*n outputs of n multiplies and n adds."""
    return 2 * n**3


def copy_bytes(nbytes: int, *, same_memory: bool) -> int:
    """Bytes moved by one copy of `nbytes`: a device-to-device copy reads and writes device memory (2x, as
    CUDA's bandwidthTest counts it); a host-to-device copy crosses the link once (1x)."""
    return 2 * nbytes if same_memory else nbytes


def per_second(amount: float, seconds: float, unit: float) -> float:
    """`amount` per second in `unit`s (1e12 for TFLOP/s, 1e9 for GB/s)."""
    if not seconds > 0:
        raise MeasureFailure(f"a timed batch took {seconds!r} s: the clock or the device is broken")
    return amount / seconds / unit


def matmul_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the device has it (Ampere and newer, and CPUs), fp16 elsewhere (Turing, Volta)."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


# -- timing --------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object], iterations: int, device: torch.device) -> float:
    """Seconds for `iterations` back-to-back calls of `fn`, measured on the device's own clock: CUDA events
    on the current stream for a GPU (kernels are asynchronous), the wall clock for the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    began = time.perf_counter()
    for _ in range(iterations):
        fn()
    return time.perf_counter() - began


def throughput(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup_s: float,
    target_s: float,
    max_iterations: int = 1000,
) -> Timing:
    """Per-iteration time of `fn`: one call (lazy set-up), warm-up batches for `warmup_s`, then one timed
    batch of about `target_s` (at least 2, at most `max_iterations` iterations)."""
    timed(fn, 1, device)
    estimate = timed(fn, 1, device)
    warmed = estimate
    while warmed < warmup_s:
        batch = _iterations(warmup_s - warmed, estimate, max_iterations)
        spent = timed(fn, batch, device)
        estimate = spent / batch
        warmed += spent
    iterations = _iterations(target_s, estimate, max_iterations)
    return Timing(timed(fn, iterations, device) / iterations, iterations)


def _iterations(budget_s: float, per_iteration_s: float, most: int) -> int:
    if per_iteration_s <= 0:
        return most
    return max(2, min(most, round(budget_s / per_iteration_s)))


# -- measurements --------------------------------------------------------------------------------------


def measure_matmul(
    device: torch.device,
    *,
    n: int = 8192,
    dtype: torch.dtype | None = None,
    warmup_s: float = 0.1,
    target_s: float = 0.15,
) -> MatmulMeasure:
    """Throughput of a large n x n matmul in bf16/fp16 (tensor cores on a GPU), its last result checked."""
    dtype = dtype or matmul_dtype(device)
    gen = torch.Generator(device=device).manual_seed(1234)
    a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    timing = throughput(lambda: torch.matmul(a, b, out=out), device, warmup_s=warmup_s, target_s=target_s)
    err = check_product(a, b, out)
    tflops = per_second(matmul_flop(n), timing.seconds, 1e12)
    return MatmulMeasure(tflops, str(dtype).removeprefix("torch."), n, timing.iterations, err)


def check_product(a: torch.Tensor, b: torch.Tensor, product: torch.Tensor) -> float:
    """Raise MeasureFailure unless `product` is a @ b: all finite, every row sum equal to a @ (b's row sums),
    and some whole rows equal to an fp32 product. Returns the largest relative error seen."""
    if not bool(torch.isfinite(product).all()):
        raise MeasureFailure(f"{_shape(a, b)} {_dtype(product)} matmul produced NaN/Inf")
    b32 = b.float()
    sums = product.sum(dim=1, dtype=torch.float32)
    expected_sums = a.float() @ b32.sum(dim=1)
    sums_err = _rel_err(sums, expected_sums)
    if not sums_err <= PRODUCT_TOLERANCE:
        raise MeasureFailure(
            f"{_shape(a, b)} {_dtype(product)} matmul: row sums differ from the reference "
            f"(max rel error {sums_err:.2e}, tolerance {PRODUCT_TOLERANCE:g})"
        )
    rows = torch.linspace(0, a.shape[0] - 1, min(CHECKED_ROWS, a.shape[0]), device=a.device).long()
    rows_err = _rel_err(product[rows].float(), a[rows].float() @ b32)
    if not rows_err <= PRODUCT_TOLERANCE:
        raise MeasureFailure(
            f"{_shape(a, b)} {_dtype(product)} matmul: checked rows differ from an fp32 product "
            f"(max rel error {rows_err:.2e}, tolerance {PRODUCT_TOLERANCE:g})"
        )
    return max(sums_err, rows_err)


def measure_copy(
    device: torch.device, *, nbytes: int = 512 << 20, warmup_s: float = 0.03, target_s: float = 0.05
) -> CopyMeasure:
    """Device-memory bandwidth: a copy of `nbytes` within the device, counted as read + write (2 x nbytes).
    The buffer must be far larger than the caches (50 MB of L2 on an H100) to measure memory, not cache."""
    src = _pattern(nbytes, device)
    dst = torch.empty_like(src)
    timing = throughput(lambda: dst.copy_(src), device, warmup_s=warmup_s, target_s=target_s)
    _check_copy(src, dst, "device memory copy")
    gbps = per_second(copy_bytes(nbytes, same_memory=True), timing.seconds, 1e9)
    return CopyMeasure(gbps, nbytes, timing.iterations)


def measure_h2d(
    device: torch.device,
    *,
    nbytes: int = 256 << 20,
    warmup_s: float = 0.03,
    target_s: float = 0.05,
    lock: AbstractContextManager[float] | None = None,
) -> CopyMeasure:
    """Host-to-device bandwidth: `nbytes` from pinned (page-locked) host memory to the device, counted once.
    Pageable memory would measure the host's staging copy, not the link. On the CPU: a plain copy. The timed
    part runs inside `lock` (host_link_lock: probes of the same host take turns), the set-up outside it."""
    host = _pattern(nbytes, torch.device("cpu"), pin=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    with lock if lock is not None else contextlib.nullcontext(0.0) as waited_s:
        timing = throughput(lambda: dst.copy_(host, non_blocking=True), device, warmup_s=warmup_s, target_s=target_s)
    _check_copy(host, dst, "host-to-device copy")
    gbps = per_second(copy_bytes(nbytes, same_memory=False), timing.seconds, 1e9)
    return CopyMeasure(gbps, nbytes, timing.iterations, round(float(waited_s or 0.0), 3))


@contextlib.contextmanager
def host_link_lock(path: str | os.PathLike[str], wait_s: float = 10.0) -> Iterator[float]:
    """An exclusive flock on `path`, yielding the seconds waited for it. The probes of one host copy to their
    GPUs in turn, as operators measure host bandwidth (one GPU at a time): together they would share the
    host's memory and PCIe switch uplinks, and which GPUs happened to overlap would decide who looks slow.
    Not had within `wait_s`, or `path` not openable: the measurement goes ahead without it."""
    started = time.monotonic()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        yield 0.0
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - started >= wait_s:
                    break
                time.sleep(0.005)
        yield time.monotonic() - started
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _pattern(nbytes: int, device: torch.device, *, pin: bool = False) -> torch.Tensor:
    """`nbytes` (a multiple of 4 KiB) of a byte pattern that differs from one 4 KiB block to the next, so a
    copy that dropped, zeroed or shifted a block shows. Built in place: no temporary of the buffer's size."""
    if nbytes <= 0 or nbytes % PATTERN_BLOCK:
        raise ValueError(f"copy size {nbytes} is not a positive multiple of {PATTERN_BLOCK} bytes")
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
    block = torch.arange(PATTERN_BLOCK, dtype=torch.int16).remainder_(251).to(torch.uint8).to(device)
    rows = torch.arange(nbytes // PATTERN_BLOCK).remainder_(256).to(torch.uint8).to(device)
    torch.add(block.unsqueeze(0), rows.unsqueeze(1), out=buf.view(-1, PATTERN_BLOCK))  # uint8: wraps mod 256
    return buf


def _check_copy(src: torch.Tensor, dst: torch.Tensor, what: str) -> None:
    same = torch.equal(src.to(dst.device), dst)
    if not same:
        raise MeasureFailure(f"{what} of {src.numel() >> 20} MiB did not reproduce its source")


def _rel_err(got: torch.Tensor, expected: torch.Tensor) -> float:
    scale = float(expected.abs().max())
    return float((got - expected).abs().max()) / (scale or 1.0)


def _shape(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{a.shape[0]}x{a.shape[1]}x{b.shape[1]}"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def measure_device(
    device: torch.device,
    *,
    n: int = 8192,
    copy_nbytes: int = 512 << 20,
    h2d_nbytes: int = 256 << 20,
    h2d_lock: AbstractContextManager[float] | None = None,
) -> dict[str, float | str]:
    """The probe's metrics for one device, as the keys of its JSON line (docs/gate.md, "Probe metrics")."""
    matmul = measure_matmul(device, n=n)
    mem = measure_copy(device, nbytes=copy_nbytes)
    h2d = measure_h2d(device, nbytes=h2d_nbytes, lock=h2d_lock)
    return {
        "matmul_tflops": _significant(matmul.tflops),
        "matmul_dtype": matmul.dtype,
        "mem_gbps": _significant(mem.gbps),
        "h2d_gbps": _significant(h2d.gbps),
        "h2d_wait_ms": round(h2d.waited_s * 1000, 1),
    }


def _significant(value: float) -> float:
    """Four significant digits: 790.2, 4220, 55.43 (and a CPU's 0.0004 does not round to zero)."""
    return float(f"{value:.4g}")

"""The built-in CUDA probe: `python -m podguard.preflight.gate.probe.cuda_child`, started by `run_probes`
with exactly one GPU visible (CUDA_VISIBLE_DEVICES=<its UUID>).

It proves the GPU can do real work, not just that NVML can see it: create a context, allocate, run a
1024x1024 fp32 matmul checked against a CPU reference and an identity product, synchronise. Then it
measures the GPU (probe/measure.py, a few hundred ms after warm-ups): a checked 8192^3 bf16 matmul
(`matmul_tflops`), a device memory copy (`mem_gbps`, read + write) and a pinned host-to-device copy
(`h2d_gbps`; the node's probes take turns for this one, a flock in the temp dir). It prints exactly one
JSON line (`ok`, `ms`, `device`, `uuid`, `error` and the metrics) and exits 0 (healthy) or 1, never with
a traceback: the parent reads the JSON line, and a person reads its `error`. A wrong result in a
measurement fails the probe like a failed check.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from podguard.preflight.gate.probe.jsonline import one_json_line

N = 1024
H2D_LOCK_NAME = "podguard-h2d.lock"  # in the temp dir: the node's probes take turns on the host link
SMALL_GPU_BYTES = 6 << 30  # less free than this (a MIG slice, a busy card): smaller measurement buffers
REL_TOLERANCE = 1e-3  # fp32 with TF32 off differs from the CPU by ~1e-6 relative; faults are far larger


class ProbeFailure(Exception):
    """A failed check, with the message the report will show."""


def probe() -> dict[str, Any]:
    """Run the checks on cuda:0; return details, or raise ProbeFailure / the CUDA error."""
    warnings.filterwarnings("ignore", message=".*NumPy.*")  # torch without numpy warns at import; noise here
    try:
        import torch  # noqa: PLC0415  lazy: torch, after the NumPy warning filter; its absence is a probe failure
    except ImportError as exc:
        raise ProbeFailure(f"torch is not importable: {exc}") from None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not available:
        hint = next((str(w.message).splitlines()[0] for w in caught if "cuda" in str(w.message).lower()), "")
        build = torch.version.cuda or "no (CPU-only build)"
        raise ProbeFailure(
            f"CUDA not available (torch {torch.__version__}, CUDA build: {build}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})" + (f": {hint}" if hint else "")
        )

    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    torch.backends.cuda.matmul.allow_tf32 = False  # full fp32, so the CPU comparison is meaningful

    # allocation: a 32 MiB buffer written and read back (sum of ones is exact in fp32 up to 2**24)
    count = 8 * 1024 * 1024
    ones = torch.ones(count, dtype=torch.float32, device=device)
    if int(ones.sum().item()) != count:
        raise ProbeFailure("a 32 MiB buffer of ones did not sum to its size: memory or compute is corrupt")
    del ones

    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(N, N, generator=gen)
    b = torch.randn(N, N, generator=gen)
    a_d, b_d = a.to(device), b.to(device)
    product = a_d @ b_d
    identity = a_d @ torch.eye(N, device=device)
    torch.cuda.synchronize(device)
    product_cpu = product.cpu()
    if not bool(torch.isfinite(product_cpu).all()):
        raise ProbeFailure(f"{N}x{N} matmul produced NaN/Inf")
    reference = a @ b
    rel_err = float((product_cpu - reference).abs().max() / reference.abs().max())
    if not rel_err <= REL_TOLERANCE:
        raise ProbeFailure(f"{N}x{N} fp32 matmul differs from the CPU reference (max rel error {rel_err:.2e})")
    if not torch.allclose(identity.cpu(), a, rtol=1e-6, atol=1e-6):
        raise ProbeFailure(f"{N}x{N} identity matmul did not return its input")
    del a_d, b_d, product, identity
    metrics = _measure(torch, device)
    return {"device": props.name, "uuid": uuid, "max_rel_err": rel_err, **metrics}


def _measure(torch: Any, device: Any) -> dict[str, Any]:
    """The metrics, sized to the memory that is free (a small MIG slice still gets measured)."""
    from podguard.preflight.gate.probe.measure import MeasureFailure, host_link_lock, measure_device  # noqa: PLC0415  lazy: imports torch at its top

    free, _total = torch.cuda.mem_get_info(device)
    small = free < SMALL_GPU_BYTES
    try:
        return measure_device(
            device,
            n=4096 if small else 8192,
            copy_nbytes=(128 if small else 512) << 20,
            h2d_nbytes=(64 if small else 256) << 20,
            h2d_lock=host_link_lock(Path(tempfile.gettempdir()) / H2D_LOCK_NAME),
        )
    except MeasureFailure as exc:
        raise ProbeFailure(str(exc)) from None


def main() -> int:
    return one_json_line(probe, ProbeFailure, {"ms": None, "device": None, "uuid": None})


if __name__ == "__main__":
    sys.exit(main())

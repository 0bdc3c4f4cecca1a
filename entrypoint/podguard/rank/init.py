"""`init_rank`: bring one training process up on the right device and into its process group.

    ctx = init_rank()          # checks LOCAL_RANK, claims cuda:N (one retry if busy), nccl/gloo group
    ...
    ctx.shutdown()

Errors say what they are (64 bad env, 69 no GPU, 75 busy, 76 unhealthy); CPU fallback only when allowed,
with a loud banner. torch is imported inside the functions, so importing this module costs nothing.
The reasons: docs/rank.md.
"""

from __future__ import annotations

import datetime
import gc
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.rank._env import emit, env_int

BACKENDS = ("nccl", "gloo")
DEVICES = ("auto", "cuda", "cpu")
ENV_CUDA_DEVICE = "PODGUARD_CUDA_DEVICE"  # explicit device index, set by launchers that isolate one GPU
_NO_GPU_TOKENS = {"", "-1", "none", "void", "nodevfiles"}
# Errors that mean "someone else has this GPU right now" (retry may succeed), not "this GPU is broken".
_BUSY_MARKERS = ("busy or unavailable", "cudaerrordevicesunavailable", "out of memory", "cudaerrormemoryallocation")


@dataclass(frozen=True)
class DistEnv:
    """The distributed variables a launcher (torchrun, podguard per-gpu) sets, validated."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str | None
    master_port: int | None
    local_world_size: int | None


@dataclass(frozen=True)
class RankContext:
    """What `init_rank` settled on for this process. `device` is a string ("cuda:0", "cpu") so the
    record stays printable and picklable without torch."""

    rank: int
    local_rank: int
    world_size: int
    device: str
    backend: str
    is_main: bool
    distributed: bool = False  # True when init_rank created the process group
    gpu_name: str = ""
    gpu_uuid: str = ""
    cpu_fallback: bool = False  # True when a GPU was expected but the CPU is used (allowed fallback)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def barrier(self) -> None:
        """A barrier across ranks (no-op when not distributed). On nccl it names this rank's device so
        torch does not guess one (the guess is what produces hangs on mis-mapped ranks)."""
        if not self.distributed:
            return
        import torch.distributed as dist  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        if self.backend == "nccl":
            dist.barrier(device_ids=[int(self.device.split(":", 1)[1])])
        else:
            dist.barrier()

    def shutdown(self) -> None:
        """Destroy the process group if one exists. Idempotent, and safe when torch was never imported:
        a clean teardown lets NCCL release its resources instead of leaving it to process exit. Drop your
        own references to DDP-wrapped models first (they hold the group)."""
        if "torch" not in sys.modules:
            return
        import torch.distributed as dist  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        if dist.is_available() and dist.is_initialized():
            # A DDP wrapper still referenced from a garbage cycle keeps the group alive past this call,
            # to be torn down during interpreter shutdown, where gloo's threads can abort the process
            # ("terminate called without an active exception", exit 134 after a successful run).
            gc.collect()
            dist.destroy_process_group()


def read_dist_env(env: Mapping[str, str] | None = None) -> DistEnv:
    """Parse RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; absent means a single process.

    Every bad value is a UsageError naming the variable and what is valid."""
    source = os.environ if env is None else env
    world_size = env_int("WORLD_SIZE", 1, minimum=1, env=source)
    rank = env_int("RANK", 0, env=source)
    local_rank = env_int("LOCAL_RANK", rank, env=source)  # unset: a single-node launcher that sets only RANK
    if rank >= world_size:
        raise UsageError(f"RANK={rank} is out of range for WORLD_SIZE={world_size}; valid RANK: 0..{world_size - 1}")
    local_world = env_int("LOCAL_WORLD_SIZE", 0, env=source) or None
    addr = (source.get("MASTER_ADDR") or "").strip() or None
    port: int | None = None
    if (source.get("MASTER_PORT") or "").strip():
        port = env_int("MASTER_PORT", None, minimum=1, env=source)
        if port > 65535:
            raise UsageError(f"MASTER_PORT={port} is out of range; valid ports: 1..65535")
    if world_size > 1:
        missing = [n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if v is None]
        if missing:
            raise UsageError(
                f"WORLD_SIZE={world_size} but {' and '.join(missing)} not set; a distributed run needs "
                "MASTER_ADDR and MASTER_PORT (torchrun and podguard train set them)"
            )
    return DistEnv(rank, local_rank, world_size, addr, port, local_world)


def resolve_device_index(local_rank: int, visible_count: int, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Which `cuda:N` this rank should use, and a note on how that was decided.

    Normally N = LOCAL_RANK. A launcher that gives each worker exactly one GPU (podguard's per-gpu mode:
    CUDA_VISIBLE_DEVICES=<that GPU's UUID>) makes every worker see its GPU as cuda:0 while LOCAL_RANK
    still counts 0..n-1; it may say so with PODGUARD_CUDA_DEVICE=0, and otherwise we recognise it: exactly
    one device listed in CUDA_VISIBLE_DEVICES and not under torchrun (torchrun sets TORCHELASTIC_RUN_ID
    and never isolates GPUs per worker, so two torchrun ranks squeezed onto one GPU stay an error).
    Anything else past the visible count is the seeds' "invalid device ordinal", caught here with a
    message that says how to fix it.
    """
    source = os.environ if env is None else env
    cvd_raw = source.get("CUDA_VISIBLE_DEVICES")
    cvd_shown = "unset (all GPUs visible)" if cvd_raw is None else repr(cvd_raw)
    if visible_count <= 0:
        raise PodguardError(
            f"no GPU is visible to LOCAL_RANK={local_rank} (visible GPUs: 0, CUDA_VISIBLE_DEVICES={cvd_shown})",
            ExitCode.GPUS_MISSING,
        )
    if (source.get(ENV_CUDA_DEVICE) or "").strip():
        index = env_int(ENV_CUDA_DEVICE, None, env=source)
        if index >= visible_count:
            raise UsageError(
                f"{ENV_CUDA_DEVICE}={index} but only {visible_count} GPU(s) are visible "
                f"(CUDA_VISIBLE_DEVICES={cvd_shown}); valid: 0..{visible_count - 1}"
            )
        return index, f"{ENV_CUDA_DEVICE}={index}"
    if local_rank < visible_count:
        return local_rank, f"LOCAL_RANK={local_rank}"
    listed = [t for t in (cvd_raw or "").split(",") if t.strip()]
    under_torchrun = bool((source.get("TORCHELASTIC_RUN_ID") or "").strip())
    if visible_count == 1 and len(listed) == 1 and not under_torchrun:
        return 0, f"one GPU isolated by CUDA_VISIBLE_DEVICES={cvd_raw}"
    raise UsageError(
        f"LOCAL_RANK={local_rank} but only {visible_count} GPU(s) are visible (CUDA_VISIBLE_DEVICES={cvd_shown}); "
        f"valid LOCAL_RANK: 0..{visible_count - 1}. Start at most {visible_count} process(es) per node "
        "(podguard train sizes this from the selected GPUs), or make more GPUs visible"
    )


def is_busy_error(exc: BaseException) -> bool:
    """True for CUDA errors that mean "held by someone else right now", where a retry may succeed."""
    text = str(exc).lower()
    return any(marker in text for marker in _BUSY_MARKERS)


def claim_cuda_device(torch_mod: Any, index: int, *, backoff_s: float, rank: int = 0) -> None:
    """Make `cuda:index` current and create its context now, retrying once after a busy error.

    `torch.cuda.set_device` alone is lazy; the context (and with it a "busy or unavailable" error from an
    exclusive-process GPU still held by a dying process) only appears at the first allocation. Doing that
    here turns a crash deep inside model code into a clear decision at start-up. The one retry waits a
    short, bounded time (plus a small per-rank offset so eight ranks do not retry in lock-step): enough
    for a process that is exiting to let go, not a blind multi-second sleep. `torch_mod` is a parameter
    so the retry logic can be tested without a GPU.
    """
    for attempt in (1, 2):
        try:
            torch_mod.cuda.set_device(index)
            torch_mod.empty(1, device=f"cuda:{index}")
            torch_mod.cuda.synchronize(index)
            return
        except RuntimeError as exc:  # torch.AcceleratorError is a RuntimeError
            if attempt == 1 and is_busy_error(exc):
                wait = min(backoff_s + 0.05 * (rank % 8), 2.0)
                emit(f"[rank {rank}] INIT: cuda:{index} busy ({_first_line(exc)}); retrying once in {wait:.2f}s")
                _sleep(wait)
                continue
            raise


@dataclass(frozen=True)
class _Device:
    """Where this rank runs, and why it is not on its GPU when it should be."""

    name: str = "cpu"  # "cuda:N" or "cpu"
    gpu_name: str = ""
    gpu_uuid: str = ""
    fallback_reason: str = ""  # non-empty: a GPU was expected but the CPU is used
    fallback_code: int = ExitCode.GPUS_MISSING

    @property
    def is_cuda(self) -> bool:
        return self.name.startswith("cuda")


def _check_arguments(backend: str | None, device: str, timeout_s: float, retry_backoff_s: float) -> None:
    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"backend={backend!r} is not valid; valid: {', '.join(BACKENDS)} or None (automatic)")
    if device not in DEVICES:
        raise UsageError(f"device={device!r} is not valid; valid: {', '.join(DEVICES)}")
    if backend == "nccl" and device == "cpu":
        raise UsageError("backend='nccl' needs GPUs but device='cpu'; use backend='gloo' on CPU")
    if not timeout_s > 0:
        raise UsageError(f"timeout_s={timeout_s!r} must be > 0")
    if not 0 <= retry_backoff_s <= 2:
        raise UsageError(f"retry_backoff_s={retry_backoff_s!r} must be between 0 and 2 seconds")


def _claim_gpu(torch_mod: Any, dist_env: DistEnv, allow_cpu_fallback: bool, retry_backoff_s: float) -> _Device:
    """This rank's GPU, claimed now (a busy/broken GPU shows up here); a fallback record when allowed."""
    rank = dist_env.rank
    index, how = resolve_device_index(dist_env.local_rank, torch_mod.cuda.device_count())
    try:
        claim_cuda_device(torch_mod, index, backoff_s=retry_backoff_s, rank=rank)
    except RuntimeError as exc:
        code = ExitCode.GPUS_BUSY if is_busy_error(exc) else ExitCode.GPU_UNHEALTHY
        reason = f"cuda:{index} could not be used: {_first_line(exc)}"
        if not allow_cpu_fallback:
            raise PodguardError(f"rank {rank}: {reason}", code) from exc
        return _Device(fallback_reason=reason, fallback_code=code)
    if how != f"LOCAL_RANK={dist_env.local_rank}":
        emit(f"[rank {rank}] INIT: using cuda:{index} ({how})")
    gpu_name, gpu_uuid = _gpu_identity(torch_mod, index)
    return _Device(f"cuda:{index}", gpu_name, gpu_uuid)


def _pick_device(
    torch_mod: Any, dist_env: DistEnv, device: str, allow_cpu_fallback: bool, retry_backoff_s: float
) -> _Device:
    if device == "cpu":
        return _Device()
    if torch_mod.cuda.is_available():
        return _claim_gpu(torch_mod, dist_env, allow_cpu_fallback, retry_backoff_s)
    if device != "cuda" and not _gpus_expected(torch_mod):
        return _Device()  # a CPU node: nothing is wrong
    reason = (
        f"CUDA is not available (torch {torch_mod.__version__}, CUDA build: "
        f"{torch_mod.version.cuda or 'no (CPU-only build)'}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})"
    )
    if not allow_cpu_fallback:
        raise PodguardError(
            f"rank {dist_env.rank}: {reason}; run `podguard doctor`, or allow CPU fallback", ExitCode.GPUS_MISSING
        )
    return _Device(fallback_reason=reason)


def _pick_backend(backend: str | None, dev: _Device, dist_env: DistEnv) -> str:
    """nccl on GPU, gloo on CPU, unless the caller chose; refuses mixes that would hang the other ranks."""
    rank = dist_env.rank
    chosen = backend or ("nccl" if dev.is_cuda else "gloo")
    if chosen == "nccl" and not dev.is_cuda:
        raise PodguardError(
            f"rank {rank}: backend nccl needs a GPU but this rank is on CPU ({dev.fallback_reason or 'no GPU'}); "
            "the other ranks would hang waiting for it. Use backend='gloo' to allow mixed devices, or fix the GPU",
            dev.fallback_code,
        )
    if dev.fallback_reason and dist_env.world_size > 1 and backend is None:
        raise PodguardError(
            f"rank {rank}: cannot fall back to CPU in a distributed run with the automatic backend (the other "
            f"ranks use nccl and would hang); pass backend='gloo' to allow it. Cause: {dev.fallback_reason}",
            dev.fallback_code,
        )
    return chosen


def _announce_fallback(rank: int, reason: str) -> None:
    emit(f"[rank {rank}] " + "!" * 72)
    emit(f"[rank {rank}] WARNING: FALLING BACK TO CPU: {reason}")
    emit(f"[rank {rank}] WARNING: training on CPU is orders of magnitude slower; this is almost never wanted")
    emit(f"[rank {rank}] " + "!" * 72)


def _join_group(torch_mod: Any, dist_env: DistEnv, backend: str, dev: _Device, timeout_s: float) -> str:
    """Create the process group (env://, so torchrun's agent store is reused); '' or ' (... ready in Xs)'."""
    import torch.distributed as dist  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

    if dist.is_initialized():
        return ""
    started = time.monotonic()
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = torch_mod.device(dev.name)  # binds the group to this GPU, no guessing later
    try:
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            world_size=dist_env.world_size,
            rank=dist_env.rank,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    except Exception as exc:
        emit(
            f"[rank {dist_env.rank}] INIT: process group ({backend}, {dist_env.master_addr}:{dist_env.master_port}, "
            f"world {dist_env.world_size}) failed after {time.monotonic() - started:.1f}s: {_first_line(exc)}"
        )
        raise
    return f" (process group ready in {time.monotonic() - started:.2f}s)"


def init_rank(
    *,
    backend: str | None = None,
    device: str = "auto",
    allow_cpu_fallback: bool = False,
    timeout_s: float = 300.0,
    retry_backoff_s: float = 0.5,
) -> RankContext:
    """Bring this process up: validate the distributed env, claim the device, join the process group.

    backend: None picks nccl on GPU and gloo on CPU; "gloo" also works with GPUs (and is the only way a
    distributed run may mix a CPU-fallback rank with GPU ranks). device: "auto" uses CUDA when torch can
    see it, "cuda" requires it, "cpu" forces the CPU. timeout_s bounds the process-group rendezvous and
    collectives. Raises UsageError (64) for bad env or arguments, PodguardError with 69 (no GPU), 75
    (GPU busy after the retry) or 76 (GPU failed) unless CPU fallback is allowed.
    """
    _check_arguments(backend, device, timeout_s, retry_backoff_s)
    dist_env = read_dist_env()
    import torch  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

    dev = _pick_device(torch, dist_env, device, allow_cpu_fallback, retry_backoff_s)
    chosen = _pick_backend(backend, dev, dist_env)
    if dev.fallback_reason:
        _announce_fallback(dist_env.rank, dev.fallback_reason)
    distributed = dist_env.world_size > 1
    took = _join_group(torch, dist_env, chosen, dev, timeout_s) if distributed else ""
    ctx = RankContext(
        rank=dist_env.rank,
        local_rank=dist_env.local_rank,
        world_size=dist_env.world_size,
        device=dev.name,
        backend=chosen,
        is_main=dist_env.rank == 0,
        distributed=distributed,
        gpu_name=dev.gpu_name,
        gpu_uuid=dev.gpu_uuid,
        cpu_fallback=bool(dev.fallback_reason),
    )
    gpu = f' gpu="{dev.gpu_name}" uuid={dev.gpu_uuid or "n/a"}' if dev.gpu_name else ""
    emit(
        f"[rank {ctx.rank}] INIT: local_rank={ctx.local_rank} world_size={ctx.world_size} device={dev.name}{gpu} "
        f"backend={chosen}{' (CPU FALLBACK)' if ctx.cpu_fallback else ''}{took}"
    )
    return ctx


def _gpus_expected(torch_mod: Any) -> bool:
    """Whether a missing CUDA means something is wrong (rather than "this is a CPU node").

    A CUDA build of torch on a host with the NVIDIA driver loaded, with GPUs not hidden on purpose,
    should see a GPU: its absence is a broken driver/container, not a reason to quietly train on CPU."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip().lower() in _NO_GPU_TOKENS:
        return False
    return torch_mod.version.cuda is not None and Path("/proc/driver/nvidia/version").exists()


def _gpu_identity(torch_mod: Any, index: int) -> tuple[str, str]:
    """The GPU's name and UUID for the log line (the UUID is what nvidia-smi and podguard's report show)."""
    try:
        props = torch_mod.cuda.get_device_properties(index)
    except Exception:  # identity is informational; never fail start-up over it
        return "unknown", ""
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    return str(getattr(props, "name", "unknown")), uuid


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return re.split(r"\r?\n", text, maxsplit=1)[0][:300]


def _sleep(seconds: float) -> None:
    """Sleep in short slices (never one long blocking sleep) so signals are handled promptly."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))

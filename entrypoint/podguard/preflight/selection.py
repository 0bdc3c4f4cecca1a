"""Which GPUs this node will use: GPU_LIST / CUDA_VISIBLE_DEVICES / NPROC_PER_NODE / expected count.

    selection = select_gpus(inventory, gpu_list="0,1")
    selection.child_env()   # {"CUDA_VISIBLE_DEVICES": "GPU-...,GPU-...", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

Children get the selected GPUs by UUID (and CUDA_DEVICE_ORDER=PCI_BUS_ID), so "GPU 2" is the same card in
podguard's report, in nvidia-smi and inside the training process (docs/gate.md, "Selection").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.gpu.backend import GpuSnapshot
from podguard.gpu.selected import SelectedGpu, Selection

if TYPE_CHECKING:
    from podguard.preflight.options import PreflightOptions

__all__ = [
    "ON_FEWER_CHOICES",
    "SelectedGpu",
    "Selection",
    "mig_scope",
    "parse_count",
    "parse_gpu_list",
    "select_for",
    "select_gpus",
]


# --------------------------------------------------------------------------------------------------
# Parsing and validation. Every bad value is a UsageError (exit 64) naming the value and what is valid;
# GPUs that are required but absent are a PodguardError with exit 69.
# --------------------------------------------------------------------------------------------------

ON_FEWER_CHOICES = ("fail", "continue")
_NO_GPU_TOKENS = {"", "-1", "none", "void", "nodevfiles"}


def parse_count(raw: str | int | None, what: str, *, minimum: int = 0) -> int | None:
    """A non-negative integer option such as NPROC_PER_NODE; None when unset."""
    if raw is None:
        return None
    text = str(raw).strip()
    if text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{what}={text!r} is not a whole number; expected an integer >= {minimum}") from None
    if value < minimum:
        raise UsageError(f"{what}={value} is out of range; expected an integer >= {minimum}")
    return value


def _valid_range(count: int) -> str:
    if count == 0:
        return "this node has no GPUs"
    return f"this node has {count} GPU{'s' if count != 1 else ''} (valid indices: 0-{count - 1}, or their UUIDs)"


def _resolve_token(token: str, what: str, raw: str, inventory: Sequence[GpuSnapshot]) -> list[SelectedGpu]:
    """One GPU_LIST / CUDA_VISIBLE_DEVICES token -> the GPU (or MIG devices) it names."""
    count = len(inventory)
    if token.lstrip("-").isdigit():
        index = int(token)
        if index < 0 or index >= count:
            raise UsageError(f"{what}={raw!r}: GPU index {index} does not exist; {_valid_range(count)}")
        return _expand(inventory[index])
    upper = token.upper()
    if upper.startswith("MIG-"):
        for gpu in inventory:
            for mig in gpu.mig_devices:
                if mig.uuid.upper() == upper:
                    return [SelectedGpu(gpu.index, gpu.uuid, mig.uuid, gpu.name)]
        raise UsageError(f"{what}={raw!r}: MIG device {token!r} is not on this node; see `podguard gpus`")
    if upper.startswith("GPU-"):
        # CUDA accepts any unique UUID prefix; so do we.
        matches = [g for g in inventory if g.uuid and g.uuid.upper().startswith(upper)]
        if len(matches) == 1:
            return _expand(matches[0])
        if not matches:
            raise UsageError(f"{what}={raw!r}: no GPU with UUID {token!r} on this node; see `podguard gpus`")
        raise UsageError(f"{what}={raw!r}: UUID prefix {token!r} matches {len(matches)} GPUs; give more of it")
    raise UsageError(
        f"{what}={raw!r}: {token!r} is not a GPU index or UUID; expected a comma-separated list such as "
        f"'0,1' or 'GPU-xxxxxxxx'; {_valid_range(count)}"
    )


def _expand(gpu: GpuSnapshot) -> list[SelectedGpu]:
    """A whole GPU: its UUID, or each of its MIG devices when MIG is on (CUDA sees MIG devices only)."""
    if gpu.mig_enabled and gpu.mig_devices:
        return [SelectedGpu(gpu.index, gpu.uuid, m.uuid, gpu.name) for m in gpu.mig_devices]
    visible = gpu.uuid or str(gpu.index)
    return [SelectedGpu(gpu.index, gpu.uuid, visible, gpu.name)]


def parse_gpu_list(raw: str, what: str, inventory: Sequence[GpuSnapshot]) -> tuple[SelectedGpu, ...] | None:
    """Parse an explicit list. Returns () for an explicit "no GPUs" (CUDA_VISIBLE_DEVICES='')."""
    text = raw.strip()
    if text.lower() in _NO_GPU_TOKENS:
        return ()
    tokens = [t.strip() for t in text.split(",")]
    if any(t == "" for t in tokens):
        raise UsageError(f"{what}={raw!r} has an empty entry; expected a comma-separated list such as '0,1,2,3'")
    chosen: list[SelectedGpu] = []
    seen: dict[str, str] = {}
    for token in tokens:
        for gpu in _resolve_token(token, what, raw, inventory):
            if gpu.visible_id in seen:
                raise UsageError(
                    f"{what}={raw!r}: GPU {gpu.index} is listed twice ({seen[gpu.visible_id]!r} and {token!r}); "
                    "each GPU may appear once"
                )
            seen[gpu.visible_id] = token
            chosen.append(gpu)
    return tuple(chosen)


def _requested(
    inventory: Sequence[GpuSnapshot], gpu_list: str | None, cuda_visible_devices: str | None, warnings: list[str]
) -> tuple[str, str | None, tuple[SelectedGpu, ...] | None]:
    """(source, its raw value, the GPUs it names) by precedence: GPU_LIST, CUDA_VISIBLE_DEVICES, all."""
    count = len(inventory)
    if gpu_list is not None and gpu_list.strip() != "":
        if cuda_visible_devices not in (None, "") and cuda_visible_devices != gpu_list:
            warnings.append(
                f"GPU_LIST={gpu_list!r} takes precedence over CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}"
            )
        return "GPU_LIST", gpu_list, parse_gpu_list(gpu_list, "GPU_LIST", inventory) if count else None
    if cuda_visible_devices is not None:
        chosen = parse_gpu_list(cuda_visible_devices, "CUDA_VISIBLE_DEVICES", inventory) if count else ()
        return "CUDA_VISIBLE_DEVICES", cuda_visible_devices, chosen
    return "all", None, tuple(g for gpu in inventory for g in _expand(gpu))


def _no_gpu_node(
    source: str, raw: str | None, require_gpu: bool, expected: int | None, warnings: list[str]
) -> Selection:
    """A node without GPUs: 69 when GPUs are required (an explicit "no GPU" list does not require one)."""
    wanted = [
        name
        for name, flag in (
            ("GPU_LIST", source == "GPU_LIST" and (raw or "").strip().lower() not in _NO_GPU_TOKENS),
            ("--require-gpu", require_gpu),
            (f"expect-gpus={expected}", bool(expected)),
        )
        if flag
    ]
    if wanted:
        raise PodguardError(
            f"no GPU on this node, but GPUs are required ({', '.join(wanted)}); "
            "start the container with the GPU runtime or pick a GPU pod",
            ExitCode.GPUS_MISSING,
        )
    warnings.append("NO GPU FOUND: running on CPU only (set --require-gpu to make this an error)")
    return Selection((), "none", 0, expected, tuple(warnings))


def _fewer(message: str, on_fewer: str, hint: str, warnings: list[str], using: int) -> None:
    if on_fewer == "fail":
        raise PodguardError(f"{message}; {hint}", ExitCode.GPUS_MISSING)
    warnings.append(f"FEWER GPUS THAN EXPECTED: {message}; continuing with {using}")


def select_gpus(
    inventory: Sequence[GpuSnapshot],
    *,
    gpu_list: str | None = None,
    cuda_visible_devices: str | None = None,
    nproc_per_node: str | int | None = None,
    expect_gpus: str | int | None = None,
    on_fewer: str = "fail",
    require_gpu: bool = False,
) -> Selection:
    """Decide which GPUs this node uses. Precedence: GPU_LIST, then CUDA_VISIBLE_DEVICES, then all.

    Indices are NVML indices (the numbers nvidia-smi shows), whatever CUDA_DEVICE_ORDER says, so that a
    user's "GPU 2" is the card nvidia-smi calls 2. An explicit list that selects no GPU on a node that
    has some (GPU_LIST=-1) is a loud warning, and with `require_gpu` a usage error (64).
    """
    if on_fewer not in ON_FEWER_CHOICES:
        raise UsageError(f"on-fewer-gpus={on_fewer!r} is not valid; choose one of: {', '.join(ON_FEWER_CHOICES)}")
    nproc = parse_count(nproc_per_node, "NPROC_PER_NODE", minimum=1)
    expected = parse_count(expect_gpus, "expect-gpus", minimum=0)
    count = len(inventory)
    warnings: list[str] = []
    source, raw, chosen = _requested(inventory, gpu_list, cuda_visible_devices, warnings)
    if count == 0:
        return _no_gpu_node(source, raw, require_gpu, expected, warnings)
    assert chosen is not None
    if expected is not None and count < expected:
        hint = "a GPU may have failed or the pod is smaller than assumed"
        hint += " (use --on-fewer-gpus continue to run on what is there)"
        _fewer(f"expected {expected} GPUs but this node has {count}", on_fewer, hint, warnings, count)
    if nproc is not None and nproc < len(chosen):
        warnings.append(f"NPROC_PER_NODE={nproc}: using the first {nproc} of {len(chosen)} selected GPUs")
        chosen = chosen[:nproc]
    elif nproc is not None and nproc > len(chosen):
        message = f"NPROC_PER_NODE={nproc} but only {len(chosen)} GPU(s) selected ({source})"
        _fewer(message, on_fewer, "lower NPROC_PER_NODE or use --on-fewer-gpus continue", warnings, len(chosen))
    if source != "all" and not chosen:
        if require_gpu:
            raise UsageError(
                f"{source}={raw!r} selects no GPU, but --require-gpu asks for one; {_valid_range(count)}: "
                f"unset {source} or name GPUs in it"
            )
        warnings.append(
            f"{source}={raw!r} selects no GPU although this node has {count}: running on CPU only "
            f"(unset {source} to use the GPUs)"
        )
    return Selection(tuple(chosen), source, count, expected, tuple(warnings))


def select_for(opts: PreflightOptions, inventory: Sequence[GpuSnapshot]) -> Selection:
    """The selection a preflight's options ask for on this inventory (UsageError 64 / PodguardError 69)."""
    return select_gpus(
        inventory,
        gpu_list=opts.gpu_list,
        cuda_visible_devices=opts.cuda_visible_devices,
        nproc_per_node=opts.nproc_per_node,
        expect_gpus=opts.expect_gpus,
        on_fewer=opts.on_fewer,
        require_gpu=opts.require_gpu,
    )


def mig_scope(
    snapshots: Mapping[int, GpuSnapshot] | None, devices: Mapping[int, Sequence[str]] | None
) -> dict[int, tuple[str, ...]]:
    """MIG-enabled GPU -> the MIG devices to work on: the ones asked for, else all of its devices."""
    out: dict[int, tuple[str, ...]] = {}
    for index, snap in (snapshots or {}).items():
        if snap.mig_enabled and snap.mig_devices:
            wanted = tuple((devices or {}).get(index) or ())
            out[index] = wanted or tuple(m.uuid for m in snap.mig_devices)
    for index, uuids in (devices or {}).items():
        if uuids and index not in out:
            out[index] = tuple(uuids)
    return out

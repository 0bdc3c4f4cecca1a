"""What the finder knows about one checkpoint: where it is, its layout, its step, and whether it is whole."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Checkpoint", "Key", "Layout", "format_size", "short_of"]

Key = tuple[str, float, int]  # (path, mtime, size): a checkpoint that changes gets a new key


class Layout(StrEnum):
    HF = "hf-trainer"  # checkpoint-<N>/ with trainer_state.json and weights
    DCP = "dcp"  # torch.distributed.checkpoint folder (.metadata written last)
    TORCH = "torch"  # a torch.save zip: .pt .pth .bin .ckpt (Lightning)
    SAFETENSORS = "safetensors"
    DEEPSPEED = "deepspeed"  # a tag folder named by DIR/latest
    MEGATRON = "megatron"  # an iter_* folder named by DIR/latest_checkpointed_iteration.txt
    ACCELERATE = "accelerate"  # accelerator.save_state(dir): random_states_<i>.pkl written last
    FOLDER = "folder"  # a step-named folder of torch/safetensors files, or any folder with a COMPLETED marker


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint under DIR. `why` says why it is not whole ("" when it is); `note` adds what a person should
    know about a whole one (e.g. a format whose completeness cannot be read)."""

    path: str  # absolute
    layout: Layout
    step: int | None
    size: int  # bytes (logical: sparse files count at their length)
    mtime: float  # the newest modification time of what it is made of (Unix seconds)
    why: str = ""
    note: str = ""

    @property
    def whole(self) -> bool:
        return not self.why

    @property
    def key(self) -> Key:
        return (self.path, self.mtime, self.size)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]


def format_size(size: int) -> str:
    """Bytes for a person: `'1.2 GB'`, `'340 MB'`, `'12 KB'`, `'87 B'` (decimal units, as file managers show)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{size} B"


def short_of(have: int, want: int) -> str:
    """`'1.2 GB of 4.1 GB'`; in bytes when the two would read the same (`'4,095 bytes of 4,096'`)."""
    a, b = format_size(have), format_size(want)
    if a == b:
        return f"{have:,} bytes of {want:,}"
    return f"{a} of {b}"

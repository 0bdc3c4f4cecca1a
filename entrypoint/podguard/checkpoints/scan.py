"""Find the checkpoints under DIR, judge each, and choose the one a restart resumes from. Reads only: nothing under
DIR is created, changed, moved or deleted.

    finding = find_checkpoints("/workspace/ckpt")
    finding.chosen        # the newest whole Checkpoint, or None
    finding.skipped       # the newer ones that are not whole (each with its `why`)
    finding.checkpoints   # all of them, newest first

Newest: the highest step; a checkpoint without a step (Lightning's `last.ckpt`) ranks by its modification time
among the others (it counts as newer than every checkpoint written before it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from podguard.checkpoints.files import TORCH_SUFFIXES, file_why
from podguard.checkpoints.folders import HF_SINGLE, MARKER, Tree, dcp_why, files_why, has_weights, hf_why, read_tree
from podguard.checkpoints.model import Checkpoint, Layout
from podguard.checkpoints.steps import step_from_name

__all__ = ["DEEPSPEED_TRACKER", "MEGATRON_TRACKER", "Finding", "find_checkpoints", "newest_first"]

DEEPSPEED_TRACKER = "latest"  # DeepSpeed: the tag of the newest finished save (engine.save_checkpoint)
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM: the newest finished iteration
_ITER = re.compile(r"^iter_(\d+)$")
_HF_SHARD = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")


@dataclass(frozen=True)
class Finding:
    directory: str
    checkpoints: tuple[Checkpoint, ...]  # newest first

    @property
    def chosen(self) -> Checkpoint | None:
        return next((c for c in self.checkpoints if c.whole), None)

    @property
    def skipped(self) -> tuple[Checkpoint, ...]:
        """The checkpoints newer than the chosen one (all of them when none is whole): none of them is whole."""
        out = []
        for c in self.checkpoints:
            if c.whole:
                break
            out.append(c)
        return tuple(out)


@dataclass(frozen=True)
class _Tracker:
    name: str  # the folder it names
    mtime: float
    layout: Layout


def find_checkpoints(directory: str | os.PathLike[str]) -> Finding:
    """Every recognised checkpoint directly under `directory` (FileNotFoundError when it does not exist)."""
    root = os.path.abspath(os.fspath(directory))
    entries = list(os.scandir(root))
    trackers = _trackers(root, {e.name for e in entries})
    found: list[Checkpoint] = []
    for entry in entries:
        if entry.name.startswith(".") or entry.name in (DEEPSPEED_TRACKER, MEGATRON_TRACKER):
            continue
        try:
            if entry.is_dir(follow_symlinks=True):
                got = _folder(entry.path, entry.name, trackers)
            else:
                got = _file(entry.path, entry.name, entry.stat(follow_symlinks=True))
        except OSError:
            continue
        if got is not None:
            found.append(got)
    if any(c.layout is Layout.HF for c in found):  # HF's final `save_model()` into output_dir is not a checkpoint
        found = [c for c in found if not (c.layout in (Layout.SAFETENSORS, Layout.TORCH) and _hf_export(c.name))]
    names = {c.name for c in found}
    for tracker in trackers:
        if tracker.name not in names:
            found.append(_missing(root, tracker))
    return Finding(root, tuple(newest_first(found)))


def newest_first(found: Sequence[Checkpoint]) -> list[Checkpoint]:
    """Highest step first; a step-less checkpoint ranks with the highest step written before it, then by mtime."""
    stepped = sorted((c for c in found if c.step is not None), key=lambda c: c.mtime)

    def key(c: Checkpoint) -> tuple[int, float]:
        if c.step is not None:
            return (c.step, c.mtime)
        before = [s.step for s in stepped if s.mtime <= c.mtime and s.step is not None]
        return (max(before, default=-1), c.mtime)

    return sorted(found, key=key, reverse=True)


def _file(path: str, name: str, st: os.stat_result) -> Checkpoint | None:
    if name.endswith(".safetensors"):
        layout = Layout.SAFETENSORS
    elif name.endswith(TORCH_SUFFIXES):
        layout = Layout.TORCH
    else:
        return None
    why, note = file_why(path, st.st_size)
    return Checkpoint(path, layout, step_from_name(name), st.st_size, st.st_mtime, why, note)


def _folder(path: str, name: str, trackers: list[_Tracker]) -> Checkpoint | None:
    tree = read_tree(path)
    step = step_from_name(name)
    layout, why, note = _judge(path, name, tree, trackers)
    if layout is None:
        return None
    if layout is Layout.FOLDER and step is None and not tree.top(MARKER):
        return None
    if tree.top(MARKER):
        why = ""  # whole whatever its layout
    return Checkpoint(path, layout, step if step is not None else _iteration(name), tree.size, tree.mtime, why, note)


def _judge(path: str, name: str, tree: Tree, trackers: list[_Tracker]) -> tuple[Layout | None, str, str]:
    tracked = next((t for t in trackers if t.name == name), None)
    kind = next((t.layout for t in trackers), None)
    if name.startswith("checkpoint-") and (tree.top("trainer_state.json") or has_weights(tree)):
        return (Layout.HF, *hf_why(path, tree))
    if kind is not None and (tracked is not None or _looks_tracked(name, kind)):
        if tracked is None:
            named = ", ".join(t.name for t in trackers)
            newer = _order(name, kind) > max(_order(t.name, kind) for t in trackers if t.layout is kind)
            if newer:
                tracker = DEEPSPEED_TRACKER if kind is Layout.DEEPSPEED else MEGATRON_TRACKER
                return kind, f"newer than {named}, which {tracker} names (the save did not finish)", ""
        return (kind, *files_why(path, tree))
    if tree.top(".metadata") or any(n.endswith(".distcp") and "/" not in n for n in tree.files):
        return Layout.DCP, dcp_why(tree), ""
    if has_weights(tree) or tree.top(MARKER):
        return (Layout.FOLDER, *files_why(path, tree))
    return None, "", ""


def _hf_export(name: str) -> bool:
    """`model.safetensors`, `pytorch_model.bin`, `adapter_model.*`, shards like `model-00001-of-00002.safetensors`."""
    return name in HF_SINGLE or _HF_SHARD.match(name) is not None or name.startswith("training_args")


def _looks_tracked(name: str, kind: Layout) -> bool:
    if kind is Layout.MEGATRON:
        return _ITER.match(name) is not None
    return name.startswith("global_step")


def _order(name: str, kind: Layout) -> int:
    step = _iteration(name) if kind is Layout.MEGATRON else step_from_name(name)
    return -1 if step is None else step


def _iteration(name: str) -> int | None:
    m = _ITER.match(name)
    return int(m.group(1)) if m else None


def _trackers(root: str, names: set[str]) -> list[_Tracker]:
    out = []
    for tracker, layout in ((DEEPSPEED_TRACKER, Layout.DEEPSPEED), (MEGATRON_TRACKER, Layout.MEGATRON)):
        if tracker not in names:
            continue
        path = os.path.join(root, tracker)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(256).strip()
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if not text or os.path.isdir(path):
            continue
        if layout is Layout.MEGATRON and text != "release":
            if not text.isdigit():
                continue
            text = f"iter_{int(text):07d}"
        out.append(_Tracker(text, mtime, layout))
    return out


def _missing(root: str, tracker: _Tracker) -> Checkpoint:
    file = DEEPSPEED_TRACKER if tracker.layout is Layout.DEEPSPEED else MEGATRON_TRACKER
    step = _iteration(tracker.name) if tracker.layout is Layout.MEGATRON else step_from_name(tracker.name)
    why = f"{file} names {tracker.name}, which does not exist"
    return Checkpoint(os.path.join(root, tracker.name), tracker.layout, step, 0, tracker.mtime, why)

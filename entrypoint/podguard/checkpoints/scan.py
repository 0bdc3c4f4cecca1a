"""Find the checkpoints under DIR, judge each, and choose the one a restart resumes from. Reads only: nothing under
DIR is created, changed, moved or deleted.

    finding = find_checkpoints("/workspace/ckpt")
    finding.chosen        # the newest whole Checkpoint, or None
    finding.skipped       # the newer ones that are not whole (each with its `why`)
    finding.checkpoints   # all of them, newest first
    find_checkpoints(d, until_whole=True)   # judge newest first, stop at the first whole one (what a restart needs)
    find_checkpoints(d, skip=finding.keys)  # judge only what is new or changed since `finding` (or list_keys(d))

Two steps: the listing (names, sizes, mtimes, tracker files: cheap) ranks the checkpoints; the judgement (header
reads, the ends of trainer_state.json) runs only where asked, so a restart costs one judgement, not one per checkpoint
(an HF trainer_state.json with a long log_history is megabytes of JSON).

Newest: the highest step (then the newest mtime); a checkpoint without a step never outranks one with a step (an
`ema.pt` or a `best.pt` written after the last save is no resume point), and those without rank by their mtime.
Folder names are free: `latest/`, `final/`, `best/` are judged by their layout; `latest` is DeepSpeed's tracker
only as a small text file. A symlink to another entry of DIR (Lightning's `save_last="link"`) is that entry,
listed once.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from podguard.checkpoints.checkpoint import Checkpoint, Key, Layout
from podguard.checkpoints.dcp import dcp_why, is_dcp
from podguard.checkpoints.files import TORCH_SUFFIXES, file_why, lightning_step
from podguard.checkpoints.folders import (
    HF_SINGLE,
    MARKER,
    Tree,
    accelerate_why,
    files_why,
    has_weights,
    hf_why,
    is_accelerate,
    read_tree,
)
from podguard.checkpoints.steps import step_from_name

__all__ = ["DEEPSPEED_TRACKER", "MEGATRON_TRACKER", "Finding", "find_checkpoints", "list_keys", "newest_first"]

DEEPSPEED_TRACKER = "latest"  # DeepSpeed: the tag of the newest finished save (engine.save_checkpoint)
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM: the newest finished iteration
TRACKER_MAX = 256  # bytes: DeepSpeed's `latest` holds a tag, Megatron's tracker an iteration number
_ITER = re.compile(r"^iter_(\d+)$")
_ACC_AUTOMATIC = re.compile(r"^checkpoint_\d+$")  # accelerate's ProjectConfiguration(automatic_checkpoint_naming)
_HF_SHARD = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")

Judge = Callable[[], tuple[str, str]]  # (why, note): why is "" for a whole checkpoint


@dataclass(frozen=True)
class Finding:
    directory: str
    checkpoints: tuple[Checkpoint, ...]  # newest first (those judged: see find_checkpoints)
    keys: frozenset[Key] = frozenset()  # every checkpoint listed, judged or not

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
class _Listed:
    """A checkpoint as the listing sees it, before its judgement."""

    path: str
    layout: Layout
    step: int | None
    size: int
    mtime: float
    judge: Judge

    @property
    def key(self) -> Key:
        return (self.path, self.mtime, self.size)

    def judged(self) -> Checkpoint:
        why, note = self.judge()
        return Checkpoint(self.path, self.layout, self.step, self.size, self.mtime, why, note)


@dataclass(frozen=True)
class _Tracker:
    name: str  # the folder it names
    mtime: float
    layout: Layout


def find_checkpoints(
    directory: str | os.PathLike[str], *, until_whole: bool = False, skip: Collection[Key] = ()
) -> Finding:
    """The recognised checkpoints directly under `directory`, judged newest first (FileNotFoundError when it does
    not exist). `until_whole`: stop after the first whole one. `skip`: leave out those listed with these keys."""
    root = os.path.abspath(os.fspath(directory))
    listed = _list(root)
    judged: list[Checkpoint] = []
    for item in newest_first(listed):
        if item.key in skip:
            continue
        judged.append(item.judged())
        if until_whole and judged[-1].whole:
            break
    return Finding(root, tuple(judged), frozenset(item.key for item in listed))


def list_keys(directory: str | os.PathLike[str]) -> frozenset[Key]:
    """The keys of the checkpoints under `directory`, none judged (a baseline for `skip`)."""
    return frozenset(item.key for item in _list(os.path.abspath(os.fspath(directory))))


class _Ranked(Protocol):
    @property
    def step(self) -> int | None: ...

    @property
    def mtime(self) -> float: ...


R = TypeVar("R", bound=_Ranked)


def newest_first(found: Sequence[R]) -> list[R]:
    """Highest step first (then the newest mtime); every step-less checkpoint after them, newest mtime first."""

    def key(c: R) -> tuple[bool, int, float]:
        return (c.step is not None, c.step or 0, c.mtime)

    return sorted(found, key=key, reverse=True)


def _list(root: str) -> list[_Listed]:
    entries = list(os.scandir(root))
    names = {e.name for e in entries}
    trackers = _trackers(root, names)
    found: list[_Listed] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        step = step_from_name(entry.name)
        try:
            if entry.name in (DEEPSPEED_TRACKER, MEGATRON_TRACKER) and not entry.is_dir(follow_symlinks=True):
                continue  # the tracker file: a `latest/` folder is judged by its layout like any other
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if os.path.dirname(target) == os.path.realpath(root) and os.path.basename(target) in names:
                    continue  # another name for an entry listed on its own (Lightning's last.ckpt link)
                step = step if step is not None else step_from_name(os.path.basename(target))
            if entry.is_dir(follow_symlinks=True):
                got = _folder(entry.path, entry.name, step, trackers)
            else:
                got = _file(entry.path, entry.name, step, entry.stat(follow_symlinks=True))
        except OSError:  # gone meanwhile, a dangling link, a symlink loop
            continue
        if got is not None:
            found.append(got)
    if any(c.layout is Layout.HF for c in found):  # HF's final `save_model()` into output_dir is not a checkpoint
        found = [c for c in found if not (c.layout in (Layout.SAFETENSORS, Layout.TORCH) and _hf_export(c.path))]
    paths = {c.path for c in found}
    for tracker in trackers:
        if os.path.join(root, tracker.name) not in paths:
            found.append(_missing(root, tracker))
    return found


def _file(path: str, name: str, step: int | None, st: os.stat_result) -> _Listed | None:
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device named like a checkpoint: reading it could block
        return None
    if name.endswith(".safetensors"):
        layout = Layout.SAFETENSORS
    elif name.endswith(TORCH_SUFFIXES):
        layout = Layout.TORCH
    else:
        return None
    size = st.st_size
    if step is None and name.endswith(".ckpt"):  # Lightning's last.ckpt: the step from its metadata
        step = lightning_step(path)
    return _Listed(path, layout, step, size, st.st_mtime, lambda: file_why(path, size))


def _folder(path: str, name: str, step: int | None, trackers: list[_Tracker]) -> _Listed | None:
    if not _may_hold_one(path, name, step, trackers):
        return None
    tree = read_tree(path)
    if tree.error:  # a checkpoint podguard cannot read is named with why, not passed over in silence
        if step is None or not os.path.lexists(path):  # (deleted meanwhile: HF's save_total_limit rotation)
            return None
        layout = Layout.HF if name.startswith("checkpoint-") else Layout.FOLDER
        why = f"{name} cannot be read ({tree.error})"
        return _Listed(path, layout, step, 0, tree.mtime, lambda: (why, ""))
    layout, judge = _classify(path, name, tree, trackers)
    if layout is None:
        return None
    if layout is Layout.FOLDER and step is None and not tree.top(MARKER):
        return None
    if tree.top(MARKER):
        judge = _whole  # whole whatever its layout
    mtime = tree.mtime
    tracked = next((t for t in trackers if t.name == name), None)
    if tracked is not None:  # the save is over when the tracker names it: a changed tracker is a new checkpoint
        mtime = max(mtime, tracked.mtime)
    step = step if step is not None else _iteration(name)
    if layout is Layout.ACCELERATE and _ACC_AUTOMATIC.match(name):
        step = None  # accelerate's automatic naming counts saves, not steps: docs/checkpoints.md
    return _Listed(path, layout, step, tree.size, mtime, judge)


def _may_hold_one(path: str, name: str, step: int | None, trackers: list[_Tracker]) -> bool:
    """Whether a folder can be a checkpoint, from its name or its own listing: a step-less folder must hold
    `.metadata`, a `.distcp` shard or `COMPLETED` itself. A data set beside the checkpoints (DIR = /workspace)
    is then one listing, not a walk of its files before every attempt and every poll of the save wait."""
    if step is not None or name.startswith("checkpoint-") or any(t.name == name for t in trackers):
        return True
    try:
        with os.scandir(path) as it:
            names = [e.name for e in it]
    except OSError:
        return False
    return MARKER in names or is_dcp(names)


def _whole() -> tuple[str, str]:
    return "", ""


def _classify(path: str, name: str, tree: Tree, trackers: list[_Tracker]) -> tuple[Layout | None, Judge]:
    """The layout from the listing alone, and the judgement to run when asked."""
    tracked = next((t for t in trackers if t.name == name), None)
    kind = next((t.layout for t in trackers), None)
    if is_accelerate(tree):  # (before HF: the diffusers scripts name accelerate's folders checkpoint-<N> too)
        return Layout.ACCELERATE, lambda: accelerate_why(path, tree)
    if name.startswith("checkpoint-") and tree.top("trainer_state.json"):
        return Layout.HF, lambda: hf_why(path, tree)
    if kind is not None and (tracked is not None or _looks_tracked(name, kind)):
        if tracked is None:
            named = ", ".join(t.name for t in trackers)
            newer = _order(name, kind) > max(_order(t.name, kind) for t in trackers if t.layout is kind)
            if newer:
                tracker = DEEPSPEED_TRACKER if kind is Layout.DEEPSPEED else MEGATRON_TRACKER
                why = f"newer than {named}, which {tracker} names (the save did not finish)"
                return kind, lambda: (why, "")
        if kind is Layout.MEGATRON:  # Megatron writes its tracker once every rank saved: a folder it named exists
            return kind, _whole
        return kind, lambda: files_why(path, tree)
    if is_dcp([n for n in tree.files if "/" not in n]):
        return Layout.DCP, lambda: (dcp_why(tree, "", path), "")
    if name.startswith("checkpoint-"):  # an HF save that did not finish (hf_why says where it stopped)
        return Layout.HF, lambda: hf_why(path, tree)
    if has_weights(tree) or tree.top(MARKER):
        return Layout.FOLDER, lambda: files_why(path, tree)
    return None, _whole


def _hf_export(path: str) -> bool:
    """`model.safetensors`, `pytorch_model.bin`, `adapter_model.*`, shards like `model-00001-of-00002.safetensors`."""
    name = os.path.basename(path)
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
            st = os.lstat(path)
            # a tracker is a small text file naming a folder; a user's `latest` symlink (to a folder or a
            # checkpoint file) is none, and its bytes are no folder name
            if not stat.S_ISREG(st.st_mode) or st.st_size > TRACKER_MAX:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(TRACKER_MAX).strip()
        except OSError:
            continue
        mtime = st.st_mtime
        if not text or not text.isprintable() or "/" in text:
            continue
        if layout is Layout.MEGATRON and text != "release":
            if not text.isdigit():
                continue
            text = f"iter_{int(text):07d}"
        out.append(_Tracker(text, mtime, layout))
    return out


def _missing(root: str, tracker: _Tracker) -> _Listed:
    file = DEEPSPEED_TRACKER if tracker.layout is Layout.DEEPSPEED else MEGATRON_TRACKER
    step = _iteration(tracker.name) if tracker.layout is Layout.MEGATRON else step_from_name(tracker.name)
    why = f"{file} names {tracker.name}, which does not exist"
    return _Listed(os.path.join(root, tracker.name), tracker.layout, step, 0, tracker.mtime, lambda: (why, ""))

"""The "whole" rules of checkpoint folders, from their listings plus header reads (files.py). Each returns
(why, note): why is "" for a whole folder.

    tree = read_tree(path)          # the files under a folder (3 levels at most): relative name -> (size, mtime)
    hf_why(path, tree)              # checkpoint-<N>/: trainer_state.json all there, its weights and every
                                    # torch.save / safetensors file in it (optimizer.pt, ...) are whole
    dcp_why(tree, "", path)         # torch DCP (dcp.py): .metadata names files that are all there, long enough
    accelerate_why(path, tree)      # accelerator.save_state: random_states_0.pkl (written last), files whole
    files_why(path, tree)           # DeepSpeed tag / Megatron iter_* / step-named folders: every weights file whole

A folder holding a `COMPLETED` marker is whole whatever its layout (scan.py checks that first).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass

from podguard.checkpoints.dcp import dcp_why
from podguard.checkpoints.files import TORCH_SUFFIXES, file_why, torch_zip_why

__all__ = [
    "HF_SINGLE",
    "MARKER",
    "Tree",
    "accelerate_why",
    "files_why",
    "has_weights",
    "hf_why",
    "is_accelerate",
    "read_tree",
]

MARKER = "COMPLETED"
MAX_DEPTH = 3
WEIGHT_SUFFIXES = (".safetensors", *TORCH_SUFFIXES)
HF_SINGLE = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
INDENT2 = b'{\n  "'  # how json.dumps(indent=2) begins an object with keys
_ACC_PICKLE = re.compile(r"^(random_states|custom_checkpoint)_\d+\.pkl$")


@dataclass(frozen=True)
class Tree:
    """The files under a folder: relative path -> (size, mtime); `mtime` is the newest of them and the folder."""

    files: dict[str, tuple[int, float]]
    mtime: float
    error: str = ""  # the folder itself cannot be listed (e.g. "Permission denied")

    @property
    def size(self) -> int:
        return sum(size for size, _ in self.files.values())

    def top(self, name: str) -> bool:
        return name in self.files


def read_tree(path: str) -> Tree:
    """The files under `path`, 3 levels deep (symlinks followed: the depth bounds a loop)."""
    files: dict[str, tuple[int, float]] = {}
    try:
        newest = os.stat(path).st_mtime  # an empty folder was written when it was made, not in 1970
    except OSError:
        newest = 0.0
    stack = [(path, "", 0)]
    while stack:
        folder, rel, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    name = f"{rel}{entry.name}"
                    try:
                        st = entry.stat(follow_symlinks=True)
                    except OSError:
                        continue
                    newest = max(newest, st.st_mtime)
                    if stat.S_ISDIR(st.st_mode):
                        if depth + 1 < MAX_DEPTH:
                            stack.append((entry.path, f"{name}/", depth + 1))
                    elif stat.S_ISREG(st.st_mode):  # (a FIFO would block the header read forever)
                        files[name] = (st.st_size, st.st_mtime)
        except OSError as exc:
            if not rel:  # the checkpoint folder itself: say so (a file deeper down just goes missing)
                return Tree({}, newest, exc.strerror or type(exc).__name__)
            continue
    return Tree(files, newest)


def has_weights(tree: Tree) -> bool:
    return any(name.endswith(WEIGHT_SUFFIXES) or name.endswith(".distcp") for name in tree.files)


def files_why(path: str, tree: Tree) -> tuple[str, str]:
    """Every weights file whole (a DCP subfolder: its .metadata); at least one there."""
    if not has_weights(tree):
        return "no weights file in it", ""
    notes = []
    for folder in sorted({n.rpartition("/")[0] for n in tree.files if n.endswith(".distcp")}):
        if why := dcp_why(tree, f"{folder}/" if folder else "", path):
            return why, ""
    for name, (size, _) in sorted(tree.files.items()):
        if name.endswith(WEIGHT_SUFFIXES):
            why, note = file_why(os.path.join(path, name), size)
            if why:
                return why, ""
            if note:
                notes.append(note)
    return "", "; ".join(notes[:1])


def is_accelerate(tree: Tree) -> bool:
    """`accelerator.save_state(dir)` (also the diffusers scripts' `checkpoint-<N>/`): no trainer_state.json, and
    accelerate's `random_states_<i>.pkl` or `optimizer.bin`."""
    top = [n for n in tree.files if "/" not in n]
    return "trainer_state.json" not in top and any(_ACC_PICKLE.match(n) or n == "optimizer.bin" for n in top)


def accelerate_why(path: str, tree: Tree) -> tuple[str, str]:
    """accelerate's save_accelerator_state writes the weights, optimizer, scheduler, sampler and scaler, then
    `random_states_<process>.pkl` (torch.save zips despite the suffix), then any registered objects'
    `custom_checkpoint_<i>.pkl` (accelerate/checkpointing.py, accelerator.py `save_state`)."""
    if "random_states_0.pkl" not in tree.files:
        return "no random_states_0.pkl (accelerate writes it last: the save did not finish)", ""
    for name in sorted(n for n in tree.files if _ACC_PICKLE.match(n)):
        why, _ = torch_zip_why(os.path.join(path, name))
        if why:
            return why, ""
    return files_why(path, tree)


def hf_why(path: str, tree: Tree) -> tuple[str, str]:
    """Hugging Face Trainer's checkpoint folder (transformers Trainer._save_checkpoint: `save_model` writes
    config.json and the weights, then the optimizer, scheduler and RNG states, and trainer_state.json last)."""
    state = "trainer_state.json"
    if state not in tree.files:
        if not tree.files:
            return "empty: the save did not finish", ""
        if not has_weights(tree) and not any(i in tree.files for i in HF_INDEXES):
            top = sorted(n for n in tree.files if "/" not in n)
            there = ", ".join(top[:3]) + (f" and {len(top) - 3} more" if len(top) > 3 else "")
            return f"only {there} in it: the save did not finish (no weights, no {state})", ""
        return f"no {state} (the Trainer writes it last: the save did not finish)", ""
    if why := json_end_why(os.path.join(path, state)):
        return why, ""
    index = next((i for i in HF_INDEXES if i in tree.files), None)
    if index is not None:
        if why := _index_why(path, tree, index):
            return why, ""
    elif not has_weights(tree):  # (DeepSpeed or FSDP state inside the folder counts: files_why judges it)
        return f"no weights ({', '.join(HF_SINGLE[:2])} or a sharded index)", ""
    # every torch.save / safetensors file: the weights, and optimizer.pt, scheduler.pt, rng_state.pth, ...,
    # which `resume_from_checkpoint` loads too (a truncated optimizer.pt fails the resume as surely as the weights)
    return files_why(path, tree)


def json_end_why(path: str) -> str:
    """ "" when a JSON file written in one go is all there. `TrainerState.save_to_json` writes
    `json.dumps(state, indent=2, sort_keys=True) + "\\n"` (transformers/trainer_callback.py): in a file that begins
    `{\\n  "` (indent=2) every nested `}` is indented and no string holds a raw newline, so a `}` alone on the
    last line is the top-level one, which ends the file; a file cut short keeps a beginning without it. That reads
    8 bytes of a trainer_state.json whose log_history is megabytes. A file of another shape is parsed whole."""
    name = os.path.basename(path)
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            first = f.read(len(INDENT2))
            f.seek(max(0, size - 3))
            last = f.read(3)
            if first == INDENT2 and size > len(INDENT2) + 2 and (last == b"\n}\n" or last.endswith(b"\n}")):
                return ""
            f.seek(0)
            json.loads(f.read())
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"
    except (ValueError, UnicodeDecodeError):
        return f"{name} does not parse (cut short?)"
    return ""


def _index_why(path: str, tree: Tree, index: str) -> str:
    """Every shard the index names is there (files_why judges each one)."""
    try:
        with open(os.path.join(path, index), "rb") as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return f"{index} does not parse"
    missing = [shard for shard in shards if shard not in tree.files]
    if missing:
        return f"{missing[0]} is missing ({index} names {len(shards)} shards)"
    return ""

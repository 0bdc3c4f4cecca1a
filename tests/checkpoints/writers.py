"""Real checkpoints written by the real libraries (torch.save, safetensors, torch.distributed.checkpoint) and
folders laid out as HF Trainer, DeepSpeed and Megatron-LM lay them out, for the finder's tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def tensors(n: int = 2, size: int = 64) -> dict[str, torch.Tensor]:
    return {f"layer{i}.weight": torch.full((size,), float(i)) for i in range(n)}


def torch_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": tensors(), "step": 7}, path)
    return path


def safetensors_file(path: Path, n: int = 2, size: int = 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors(n, size), str(path))
    return path


def dcp_folder(path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": tensors()}, checkpoint_id=str(path))
    return path


def hf_checkpoint(root: Path, step: int, *, sharded: bool = False) -> Path:
    """transformers Trainer._save_checkpoint: checkpoint-<step>/ with the weights, trainer_state.json and more."""
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if sharded:
        weight_map = {}
        for i in range(2):
            shard = f"model-{i + 1:05d}-of-00002.safetensors"
            save_file({f"layer{i}.weight": torch.ones(8)}, str(folder / shard))
            weight_map[f"layer{i}.weight"] = shard
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        safetensors_file(folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    (folder / "generation_config.json").write_text("{}")
    # (transformers 5.x, as a tiny Trainer with save_steps lays it out: these, then trainer_state.json last)
    torch.save({"state": {}}, folder / "optimizer.pt")
    torch.save({"last_epoch": step}, folder / "scheduler.pt")
    torch.save({"python": 1, "numpy": 2, "cpu": torch.get_rng_state()}, folder / "rng_state.pth")
    torch.save({"output_dir": str(root)}, folder / "training_args.bin")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}, indent=2))
    return folder


def deepspeed_checkpoint(root: Path, step: int, *, latest: bool = True) -> Path:
    """DeepSpeedEngine.save_checkpoint: <tag>/mp_rank_00_model_states.pt and the ZeRO shards, then `latest`."""
    tag = root / f"global_step{step}"
    torch_file(tag / "mp_rank_00_model_states.pt")
    torch_file(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    if latest:
        (root / "latest").write_text(f"global_step{step}")
    return tag


def megatron_checkpoint(root: Path, iteration: int, *, tracker: bool = True) -> Path:
    """Megatron-LM save_checkpoint: iter_<7 digits>/mp_rank_00/model_optim_rng.pt, then the tracker file."""
    folder = root / f"iter_{iteration:07d}"
    torch_file(folder / "mp_rank_00" / "model_optim_rng.pt")
    if tracker:
        (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return folder


def truncate(path: Path, keep: float = 0.5) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def age(path: Path, seconds_ago: float) -> None:
    """Set the mtime of a file or of a folder and everything in it."""
    import time

    t = time.time() - seconds_ago
    targets = [path] if path.is_file() else [*path.rglob("*"), path]
    for p in targets:
        os.utime(p, (t, t))


ACCELERATE_SAVE = """
import sys, torch
from accelerate import Accelerator
acc = Accelerator(cpu=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
acc.save_state(sys.argv[1])
"""


def accelerate_state(folder: Path) -> Path:
    """accelerate's own `Accelerator.save_state(folder)` (in a subprocess: accelerate's state is per process)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", ACCELERATE_SAVE, str(folder)], check=True, capture_output=True)
    return folder

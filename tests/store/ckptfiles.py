"""Real checkpoints for the store's tests, written by the real libraries: an HF Trainer-like `checkpoint-<N>/`
folder (safetensors weights, torch.save zips, trainer_state.json last) and a torch.save file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def hf_like(root: Path, step: int, size: int = 4096) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.full((64,), float(step))}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    torch.save({"state": {}, "step": step}, folder / "optimizer.pt")
    torch.save({"cpu": torch.get_rng_state()}, folder / "rng_state.pth")
    (folder / "extra.dat").write_bytes(os.urandom(size))  # (not judged: only copied)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def torch_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.ones(64)}, "step": 7}, path)
    return path

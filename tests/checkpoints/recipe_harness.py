"""Runs a recipe of docs/checkpoints.md exactly as printed, with a crash and a stop added from outside: the
`heartbeat(step)` each recipe sends once per optimizer step (podguard's HF and Lightning callbacks send it too) is
wrapped before the recipe runs.

    python recipe_harness.py CRASH_AT STOP_AT recipe.py

After step CRASH_AT of the first attempt (PODGUARD_RESTART_COUNT=0) the process dies at once (exit 3), as a killed
job does (0: never). After step STOP_AT it prints `harness: step N sha256 <digest>` (the parameters and the
optimizer state of the optimizer that stepped last, in parameter order) and exits 0.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import podguard.rank.progress as progress

crash_at, stop_at, recipe = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
stepped: list[torch.optim.Optimizer] = []


def remember(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    stepped[:] = [optimizer]


def digest() -> str:
    h = hashlib.sha256()
    (optimizer,) = stepped
    for group in optimizer.param_groups:
        for p in group["params"]:
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                h.update(key.encode())
                if isinstance(value, torch.Tensor):
                    h.update(value.detach().cpu().contiguous().numpy().tobytes())
                else:
                    h.update(repr(value).encode())
    return h.hexdigest()


real = progress.heartbeat


def heartbeat(step: int | None = None) -> None:
    real(step)
    if step == crash_at and os.environ.get("PODGUARD_RESTART_COUNT") == "0":
        print(f"harness: crash after step {step}", flush=True)
        os._exit(3)
    if step == stop_at:
        print(f"harness: step {step} sha256 {digest()}", flush=True)
        os._exit(0)


register_optimizer_step_post_hook(remember)
progress.heartbeat = heartbeat  # (before the recipe imports it, through podguard.rank or an integration)
sys.argv = [recipe]
runpy.run_path(recipe, run_name="__main__")
raise SystemExit(f"harness: the recipe ended before step {stop_at}")

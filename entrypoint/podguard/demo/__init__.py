"""The built-in demo training job: what `podguard train` runs when given no command.

A small real model (a residual MLP) learning a synthetic classification task, using every training
helper podguard ships: `init_rank`, the import lock around `import torch`, memory phase logging,
prepare-once for the dataset, DDP (NCCL over the selected GPUs, or gloo over CPU processes), a progress
line with throughput and ETA, the NaN guard and a final summary.

Run it standalone (`python -m podguard.demo`), under torchrun, or under podguard's per-gpu launcher:
it reads RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT when they are set and runs as a
single process when they are not. Importing this package does not import torch.
"""

from __future__ import annotations

import importlib.util
import sys

from podguard.errors import UsageError

__all__ = ["TORCH_INSTALL_HINT", "require_torch", "torch_missing"]

TORCH_INSTALL_HINT = (
    "pip install 'podguard[torch]' (or the torch wheel for your CUDA version: https://pytorch.org/get-started/locally/)"
)


def torch_missing() -> str | None:
    """Why the demo cannot run in this Python (one line), or None when torch is there: found, not imported."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    where = sys.executable
    return f"the built-in demo job needs torch, which this Python ({where}) does not have: {TORCH_INSTALL_HINT}"


def require_torch() -> None:
    """UsageError (exit 64: the environment is misconfigured, no GPU or retry changes that) without torch."""
    if (why := torch_missing()) is not None:
        raise UsageError(why)

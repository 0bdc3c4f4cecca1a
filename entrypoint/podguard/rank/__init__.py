"""Helpers for training scripts: import them inside the training process.

    from podguard.rank import init_rank, serialized, log_memory, NanGuard, heartbeat, busy

    log_memory("START")
    with serialized("import"):          # one rank at a time through the heavy imports / kernel compiles
        import torch
    log_memory("POST-IMPORT")
    ctx = init_rank()                    # device, process group, one line per rank
    ...
    guard = NanGuard(model, max_consecutive=3)
    ...
    ctx.shutdown()

Importing this package is cheap (standard library only): torch is imported inside the functions that
need it, so the lock can be taken *before* torch is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from podguard.rank.busy import busy
    from podguard.rank.config import PRESETS, TrainConfig, build_config, load_config_file, preset
    from podguard.rank.init import RankContext, init_rank, read_dist_env, resolve_device_index
    from podguard.rank.lock import LockHold, serialized
    from podguard.rank.memlog import MemorySample, log_memory, sample_memory
    from podguard.rank.nanguard import NanGuard, NonFiniteError
    from podguard.rank.progress import heartbeat
    from podguard.rank.resume import SaveRequest, resume_from, resume_step

# Loaded on first use, so that `python -m podguard.rank.wrap` (started once per torchrun rank) imports
# only what it needs.
_HOMES = {
    "PRESETS": "config", "TrainConfig": "config", "build_config": "config", "load_config_file": "config",
    "preset": "config", "RankContext": "init", "init_rank": "init", "read_dist_env": "init",
    "resolve_device_index": "init", "busy": "busy", "LockHold": "lock", "serialized": "lock", "MemorySample": "memlog",
    "log_memory": "memlog", "sample_memory": "memlog", "NanGuard": "nanguard", "NonFiniteError": "nanguard",
    "heartbeat": "progress", "resume_from": "resume", "resume_step": "resume", "SaveRequest": "resume",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'podguard.rank' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"podguard.rank.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "PRESETS",
    "LockHold",
    "MemorySample",
    "NanGuard",
    "NonFiniteError",
    "RankContext",
    "SaveRequest",
    "TrainConfig",
    "build_config",
    "busy",
    "heartbeat",
    "init_rank",
    "load_config_file",
    "log_memory",
    "preset",
    "read_dist_env",
    "resolve_device_index",
    "resume_from",
    "resume_step",
    "sample_memory",
    "serialized",
]

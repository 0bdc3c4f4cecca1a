"""Helpers for training scripts: import them inside the training process.

    from podguard.rank import init_rank, serialized, log_memory, NanGuard

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

from podguard.rank.config import PRESETS, TrainConfig, build_config, load_config_file, preset
from podguard.rank.init import RankContext, init_rank, read_dist_env, resolve_device_index
from podguard.rank.lock import LockHold, serialized
from podguard.rank.memlog import MemorySample, log_memory, sample_memory
from podguard.rank.nanguard import NanGuard, NonFiniteError

__all__ = [
    "PRESETS",
    "LockHold",
    "MemorySample",
    "NanGuard",
    "NonFiniteError",
    "RankContext",
    "TrainConfig",
    "build_config",
    "init_rank",
    "load_config_file",
    "log_memory",
    "preset",
    "read_dist_env",
    "resolve_device_index",
    "sample_memory",
    "serialized",
]

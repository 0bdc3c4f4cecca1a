"""Lightning and podguard.

    from podguard.integrations.lightning import PodguardCallback
    from podguard.rank import resume_from

    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(dirpath=DIR, ...), PodguardCallback(DIR)])
    trainer.fit(model, ckpt_path=resume_from())            # None: from scratch

Each training batch sends `heartbeat(global_step)`; on `--save-signal` (PODGUARD_SAVE_SIGNAL, default SIGUSR1)
every rank calls `trainer.save_checkpoint(DIR/step=<N>.ckpt)` after the current batch. Works with `lightning` or
the older `pytorch_lightning` package.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:
        raise ImportError("podguard.integrations.lightning needs lightning: pip install lightning") from exc

from podguard.rank.progress import heartbeat
from podguard.rank.resume import SaveRequest

__all__ = ["PodguardCallback"]


class PodguardCallback(Callback):  # type: ignore[misc]
    """`dirpath`: where the save on the signal goes (default PODGUARD_CHECKPOINTS, which podguard sets)."""

    def __init__(self, dirpath: str | None = None, save_signal: int | None = None) -> None:
        self.dirpath = dirpath or os.environ.get("PODGUARD_CHECKPOINTS") or "."
        self.request = SaveRequest(save_signal)
        self.saved: list[str] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        heartbeat(trainer.global_step)
        if self.request.take(device=pl_module.device):
            path = os.path.join(self.dirpath, f"step={trainer.global_step}.ckpt")
            trainer.save_checkpoint(path)  # every rank: the strategy decides who writes
            self.saved.append(path)

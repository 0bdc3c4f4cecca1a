"""Lightning and podguard.

    from podguard.integrations.lightning import PodguardCallback
    from podguard.rank import resume_from

    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(dirpath=DIR, ...), PodguardCallback(DIR)])
    trainer.fit(model, ckpt_path=resume_from())            # None: from scratch

Each training batch sends `heartbeat(global_step)`; validation runs and checkpoint saves are announced
(`podguard.rank.busy`, at most `busy_max_s`, default 1 h: from `on_validation_start` to `on_validation_end`, from
`on_save_checkpoint` to the next hook), so a long validation or save is not a hang for podguard. On `--save-signal`
(PODGUARD_SAVE_SIGNAL, default SIGUSR1) every rank calls `trainer.save_checkpoint(DIR/step=<N>.ckpt)` after the
current batch. Works with `lightning` or the older `pytorch_lightning` package.
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

from podguard.rank.busy import DEFAULT_MAX_S, busy
from podguard.rank.progress import heartbeat
from podguard.rank.resume import SaveRequest

__all__ = ["PodguardCallback"]


class PodguardCallback(Callback):  # type: ignore[misc]
    """`dirpath`: where the save on the signal goes (default PODGUARD_CHECKPOINTS, which podguard sets)."""

    def __init__(self, dirpath: str | None = None, save_signal: int | None = None, busy_max_s: float = DEFAULT_MAX_S):
        self.dirpath = dirpath or os.environ.get("PODGUARD_CHECKPOINTS") or "."
        self.request = SaveRequest(save_signal)
        self.saved: list[str] = []
        self.busy_max_s = busy_max_s
        self._busy: busy | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._done()  # (a save announced after the last batch is over by now)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._done()
        heartbeat(trainer.global_step)
        if self.request.take(device=pl_module.device):
            path = os.path.join(self.dirpath, f"step={trainer.global_step}.ckpt")
            trainer.save_checkpoint(path)  # every rank: the strategy decides who writes
            self.saved.append(path)
            self._done()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._announce("evaluating")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._done()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._announce("saving")  # the file is written after the hooks: done at the next hook

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._done()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._done()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._done()

    def _announce(self, what: str) -> None:
        if self._busy is None:
            self._busy = busy(what, max_s=self.busy_max_s).start()

    def _done(self) -> None:
        if self._busy is not None:
            self._busy.end()
            self._busy = None

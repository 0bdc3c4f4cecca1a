"""Hugging Face Trainer and podguard.

    from podguard.integrations.hf import PodguardCallback
    from podguard.rank import resume_from

    trainer = Trainer(..., callbacks=[PodguardCallback()])
    trainer.train(resume_from_checkpoint=resume_from())   # None: from scratch (never "No valid checkpoint found")

Each step sends `heartbeat(global_step)`; on `--save-signal` (PODGUARD_SAVE_SIGNAL, default SIGUSR1) the Trainer
saves a checkpoint at the end of the current step (`control.should_save`), into its usual
`output_dir/checkpoint-<step>`: give podguard `--checkpoints <output_dir>`.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("podguard.integrations.hf needs transformers: pip install transformers") from exc

from podguard.rank.progress import heartbeat
from podguard.rank.resume import SaveRequest

__all__ = ["PodguardCallback"]


class PodguardCallback(TrainerCallback):  # type: ignore[misc]
    """Heartbeats and the save on podguard's save signal (create it in the main thread: it sets the handler)."""

    def __init__(self, save_signal: int | None = None) -> None:
        self.request = SaveRequest(save_signal)
        self.saves_requested = 0

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        heartbeat(state.global_step)
        if self.request.take(device=getattr(args, "device", None)):
            self.saves_requested += 1
            control.should_save = True
        return control

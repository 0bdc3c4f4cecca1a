"""Hugging Face Trainer and podguard.

    from podguard.integrations.hf import PodguardCallback
    from podguard.rank import resume_from

    trainer = Trainer(..., callbacks=[PodguardCallback()])
    trainer.train(resume_from_checkpoint=resume_from())   # None: from scratch (never "No valid checkpoint found")

Each step sends `heartbeat(global_step)`; each save and each evaluation is announced (`podguard.rank.busy`, at most
`busy_max_s`, default 1 h): the Trainer saves and evaluates right after `on_step_end` (and `on_epoch_end`), once the
flow callback asked for it, and says it is done in `on_save` / `on_evaluate`, so a long save or evaluation is not a
hang for podguard. On `--save-signal` (PODGUARD_SAVE_SIGNAL, default SIGUSR1) the Trainer saves a checkpoint at the
end of the current step (`control.should_save`), into its usual `output_dir/checkpoint-<step>`: give podguard
`--checkpoints <output_dir>`.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("podguard.integrations.hf needs transformers: pip install transformers") from exc

from podguard.rank.busy import DEFAULT_MAX_S, busy
from podguard.rank.progress import heartbeat
from podguard.rank.resume import SaveRequest

__all__ = ["PodguardCallback"]


class PodguardCallback(TrainerCallback):  # type: ignore[misc]
    """Heartbeats, saves and evaluations announced, the save on podguard's save signal (create it in the main
    thread: it sets the handler)."""

    def __init__(self, save_signal: int | None = None, busy_max_s: float = DEFAULT_MAX_S) -> None:
        self.request = SaveRequest(save_signal)
        self.saves_requested = 0
        self.busy_max_s = busy_max_s
        self._busy: busy | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        heartbeat(state.global_step)
        if self.request.take(device=getattr(args, "device", None)):
            self.saves_requested += 1
            control.should_save = True
        self._announce(control)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._announce(control)
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._done()
        self._announce(control)  # a save that follows the evaluation
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._done()
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._done()  # (whatever was announced is over by the next step)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._done()
        return control

    def _announce(self, control: Any) -> None:
        what = "evaluating" if control.should_evaluate else "saving" if control.should_save else None  # (in order)
        if what is not None and self._busy is None:
            self._busy = busy(what, max_s=self.busy_max_s).start()

    def _done(self) -> None:
        if self._busy is not None:
            self._busy.end()
            self._busy = None

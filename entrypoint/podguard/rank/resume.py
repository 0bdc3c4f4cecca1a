"""Inside the job: the checkpoint podguard hands it (`--checkpoints DIR`), and whether a save was asked for.

    from podguard.rank import SaveRequest, resume_from, resume_step
    path = resume_from()            # the newest whole checkpoint's absolute path, or None: start from scratch
    trainer.train(resume_from_checkpoint=resume_from())

    request = SaveRequest()         # in the main thread: handles --save-signal (PODGUARD_SAVE_SIGNAL, else SIGUSR1)
    if request.take(device):        # once per step, on every rank: True on all ranks together
        save(...)

A rank that saved alone at another step than the others would wait forever in the save's collectives, so
`take` asks the other ranks once per step (one tiny all-reduce, only under torch.distributed).

podguard sets PODGUARD_RESUME_FROM (and PODGUARD_RESUME_STEP when the step is known) before each attempt, the
first included; a job started outside podguard gets None. Standard library only (docs/checkpoints.md).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["ENV_RESUME_FROM", "ENV_RESUME_STEP", "SaveRequest", "resume_from", "resume_step", "save_signal_from_env"]

ENV_RESUME_FROM = "PODGUARD_RESUME_FROM"
ENV_RESUME_STEP = "PODGUARD_RESUME_STEP"


def resume_from() -> str | None:
    """The checkpoint to resume from (PODGUARD_RESUME_FROM), or None when there is none (yet)."""
    return os.environ.get(ENV_RESUME_FROM) or None


def resume_step() -> int | None:
    """Its step (PODGUARD_RESUME_STEP), or None when unknown."""
    raw = (os.environ.get(ENV_RESUME_STEP) or "").strip()
    return int(raw) if raw.isdigit() else None


def save_signal_from_env() -> int:
    """The signal to listen for: PODGUARD_SAVE_SIGNAL (as podguard's option takes it: USR1, SIGUSR1, 10), else
    SIGUSR1."""
    raw = (os.environ.get("PODGUARD_SAVE_SIGNAL") or "").strip().upper()
    if raw.isdigit():
        return int(raw)
    if raw and raw not in ("NONE", "OFF"):
        name = raw if raw.startswith("SIG") else f"SIG{raw}"
        if name in signal.Signals.__members__:
            return int(signal.Signals[name])
    return int(signal.SIGUSR1)


def _save_signal_set() -> bool:
    return (os.environ.get("PODGUARD_SAVE_SIGNAL") or "").strip().upper() not in ("", "NONE", "OFF")


class SaveRequest:
    """Armed when a signal is given or podguard runs the job with `--save-signal` (PODGUARD_SAVE_SIGNAL); unarmed it
    installs no handler and `take()` costs nothing: no collective, no device sync in a job nobody asks to save."""

    def __init__(self, signum: int | None = None) -> None:
        self.armed = signum is not None or _save_signal_set()
        self.signum = save_signal_from_env() if signum is None else int(signum)
        self._flag = False
        if self.armed and threading.current_thread() is threading.main_thread():
            signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._flag = True

    def take(self, device: Any = None) -> bool:
        """Whether any rank was asked to save since the last call (every rank gets the same answer). `device`: where
        the all-reduce's tensor lives (the rank's CUDA device under NCCL, its default when None)."""
        if not self.armed:
            return False
        flag, self._flag = self._flag, False
        try:
            import torch.distributed as dist  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper
        except ImportError:
            return flag
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return flag
        import torch  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        if device is None and dist.get_backend() == "nccl":  # NCCL reduces CUDA tensors only
            device = torch.device("cuda", torch.cuda.current_device())
        t = torch.tensor([1 if flag else 0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

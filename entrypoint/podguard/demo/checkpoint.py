"""The demo job's checkpoints: resume from what podguard hands over, save every N steps and on the save signal.

    ckpt = DemoCheckpoints(args, ctx, device)   # args.checkpoint_dir None: no checkpoints; args.save_request
    first = ckpt.resume(model, optimizer, gen)               # the step to start from (1 when none)
    if ckpt.after_step(step, model, optimizer, gen):         # every rank, every step; True: saved on the signal
        break                                                # podguard is about to stop the job: stop here

Files are `DIR/step-<N>.pt` (torch.save: model, optimizer, the batch sampler's state, the step), written by rank 0
to a hidden temporary name and renamed, so a crash mid-save never leaves a half file under a checkpoint's name.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from podguard.rank import RankContext, SaveRequest, resume_from
from podguard.rank._env import emit

__all__ = ["DemoCheckpoints"]


class DemoCheckpoints:
    def __init__(self, args: argparse.Namespace, ctx: RankContext, device: Any) -> None:
        self.directory = Path(args.checkpoint_dir) if args.checkpoint_dir else None
        self.every = max(0, args.save_every)
        self.ctx = ctx
        self.device = device
        self.request: SaveRequest | None = getattr(args, "save_request", None)  # set up at the start of main()
        if self.request is None and self.directory is not None:
            self.request = SaveRequest()
        self.saved_on_signal = 0

    def resume(self, model: Any, optimizer: Any, gen: Any) -> int:
        """Load PODGUARD_RESUME_FROM when it is one of ours; the first step to run."""
        path = resume_from()
        if self.directory is None or path is None:
            return 1
        if not os.path.isfile(path) or not os.path.basename(path).startswith("step-"):
            if self.ctx.is_main:
                emit(f"[demo] not resuming from {path}: not a demo checkpoint (step-<N>.pt); starting from scratch")
            return 1
        import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

        state = torch.load(path, map_location="cpu", weights_only=True)
        _module(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        gen.set_state(state["sampler"][self.ctx.rank % len(state["sampler"])])
        if self.ctx.is_main:
            emit(f"[demo] resumed from {path} at step {state['step']}")
        return int(state["step"]) + 1

    def after_step(self, step: int, model: Any, optimizer: Any, gen: Any) -> bool:
        """Save when due or asked; True when it saved on the save signal (the job is about to be stopped)."""
        if self.request is None:
            return False
        asked = self.request.take(self.device)  # every rank, every step: they all save at the same step
        if asked or (self.every and step % self.every == 0):
            self.save(step, model, optimizer, gen, why="on the save signal" if asked else f"every {self.every}")
            self.saved_on_signal += int(asked)
        return asked

    def save(self, step: int, model: Any, optimizer: Any, gen: Any, *, why: str) -> None:
        import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

        samplers = [gen.get_state()]
        if self.ctx.distributed:
            import torch.distributed as dist  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

            gathered: list[Any] = [None] * self.ctx.world_size
            dist.all_gather_object(gathered, gen.get_state())
            samplers = gathered
        if not self.ctx.is_main:
            return
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step-{step}.pt"
        tmp = self.directory / f".step-{step}.pt.tmp"
        state = {"model": _module(model).state_dict(), "optimizer": optimizer.state_dict(), "sampler": samplers}
        torch.save({**state, "step": step}, tmp)
        os.replace(tmp, final)
        emit(f"[demo] saved {final} ({why})")


def _module(model: Any) -> Any:
    return getattr(model, "module", model)

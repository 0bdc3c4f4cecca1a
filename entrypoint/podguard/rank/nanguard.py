"""A NaN/Inf guard that every rank agrees with: all ranks skip a bad step, or all stop together.

    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if guard.check(step, loss.detach(), grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)   # always, so a skipped step's bad gradients are dropped

Each bad step is dumped as JSON into the state dir; stopping raises `NonFiniteError`. Cost on a good step:
one small all-reduce and one device sync. Why collective: docs/rank.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from podguard.errors import UsageError
from podguard.rank._env import current_rank, emit
from podguard.state import state_dir, subdir

POLICIES = ("skip", "stop")


class NonFiniteError(RuntimeError):
    """Training produced non-finite values and the guard's policy says stop. Every rank raises it at
    the same step, so no rank is left waiting in a collective."""

    def __init__(self, message: str, *, step: int, dump_path: Path | None) -> None:
        super().__init__(message)
        self.step = step
        self.dump_path = dump_path


class NanGuard:
    """Decide, identically on every rank, whether a step's results may be applied.

    policy "skip": skip bad steps, stop after `max_consecutive` bad steps in a row.
    policy "stop": stop at the first bad step.
    """

    def __init__(
        self,
        model: Any,
        *,
        max_consecutive: int = 3,
        dump_dir: str | os.PathLike[str] | None = None,
        policy: str = "skip",
        group: Any = None,
        max_listed: int = 50,
        log: bool = True,
    ) -> None:
        if policy not in POLICIES:
            raise UsageError(f"NaN guard policy={policy!r} is not valid; valid: {', '.join(POLICIES)}")
        if isinstance(max_consecutive, bool) or not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise UsageError(f"NaN guard max_consecutive={max_consecutive!r} is not valid; it must be an integer >= 1")
        self.model = model
        self.policy = policy
        self.max_consecutive = max_consecutive
        self.group = group
        self.max_listed = max_listed
        self.log = log
        self._dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.consecutive = 0  # bad steps in a row, as agreed by all ranks
        self.total_bad = 0
        self.skipped_steps: list[int] = []
        self.last_dump: Path | None = None

    # ------------------------------------------------------------------------------------------------

    def check(self, step: int, loss: Any, grad_norm: Any = None) -> bool:
        """True: every rank's loss and grad norm are finite, apply the step. False: skip it (on every
        rank). Raises NonFiniteError on every rank when the policy says stop."""
        import torch  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        device = self._device(loss)
        local_bad = (_nonfinite(torch, loss, device) | _nonfinite(torch, grad_norm, device)).to(torch.float32)
        world, rank = self._world_and_rank()
        if world > 1:
            import torch.distributed as dist  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

            flags = torch.zeros(world, dtype=torch.float32, device=device)
            flags[rank] = local_bad
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            bad_ranks = [i for i, flag in enumerate(flags.tolist()) if flag > 0]
        else:
            bad_ranks = [rank] if local_bad.item() > 0 else []
        if not bad_ranks:
            self.consecutive = 0
            return True

        self.consecutive += 1
        self.total_bad += 1
        stop = self.policy == "stop" or self.consecutive >= self.max_consecutive
        decision = "stop" if stop else "skip"
        dump = self._dump(step, loss, grad_norm, rank, world, bad_ranks, decision)
        shown = f"loss={_fmt(loss)} grad_norm={_fmt(grad_norm)}"
        if stop:
            why = "policy stop" if self.policy == "stop" else f"{self.consecutive} consecutive bad steps"
            message = (
                f"non-finite values at step {step} (ranks {bad_ranks}; this rank {shown}): stopping ({why}); "
                f"dump: {dump or 'not written'}"
            )
            if self.log:
                emit(f"[rank {rank}] NAN-GUARD: {message}")
            raise NonFiniteError(message, step=step, dump_path=dump)
        self.skipped_steps.append(step)
        if self.log:
            emit(
                f"[rank {rank}] NAN-GUARD: step {step} non-finite on ranks {bad_ranks} ({shown} here): skipping "
                f"the step on all ranks ({self.consecutive}/{self.max_consecutive} consecutive); dump: {dump}"
            )
        return False

    # ------------------------------------------------------------------------------------------------

    def _world_and_rank(self) -> tuple[int, int]:
        import torch.distributed as dist  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(self.group), dist.get_rank(self.group)
        return 1, current_rank()

    def _device(self, loss: Any) -> Any:
        """Where the flag lives: the model's device (nccl needs CUDA tensors), else the loss's."""
        import torch  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        try:
            return next(iter(self.model.parameters())).device
        except (AttributeError, StopIteration, TypeError):
            pass
        if isinstance(loss, torch.Tensor):
            return loss.device
        return torch.device("cpu")

    def _dump(
        self, step: int, loss: Any, grad_norm: Any, rank: int, world: int, bad_ranks: list[int], decision: str
    ) -> Path | None:
        """Write this rank's view of the bad step. Never raises: a full disk must not mask the NaN."""
        try:
            params, grads, checked = self._nonfinite_tensors()
            record = {
                "step": step,
                "rank": rank,
                "world_size": world,
                "host": os.uname().nodename,
                "pid": os.getpid(),
                "time": time.time(),
                "loss": _fmt(loss),
                "grad_norm": _fmt(grad_norm),
                "bad_ranks": bad_ranks,
                "this_rank_nonfinite": rank in bad_ranks,
                "consecutive": self.consecutive,
                "max_consecutive": self.max_consecutive,
                "policy": self.policy,
                "decision": decision,
                "parameters_checked": checked,
                "nonfinite_parameters": params[: self.max_listed],
                "nonfinite_gradients": grads[: self.max_listed],
                "nonfinite_parameters_total": len(params),
                "nonfinite_gradients_total": len(grads),
            }
            directory = self._dump_dir
            if directory is None:
                directory = subdir(state_dir(), "nan")
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"nonfinite-step{step:08d}-rank{rank}.json"
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(tmp, path)
            self.last_dump = path
            return path
        except Exception as exc:
            if self.log:
                emit(f"[rank {rank}] NAN-GUARD: could not write the dump: {type(exc).__name__}: {exc}")
            return None

    def _nonfinite_tensors(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """Names and counts of non-finite parameters and gradients (only on bad steps: it is a full scan)."""
        import torch  # noqa: PLC0415  lazy: torch, imported by the job that calls this helper

        named = getattr(self.model, "named_parameters", None)
        if named is None:
            return [], [], 0
        params: list[dict[str, Any]] = []
        grads: list[dict[str, Any]] = []
        checked = 0
        with torch.no_grad():
            for name, p in named():
                checked += 1
                bad = int((~torch.isfinite(p.detach())).sum().item())
                if bad:
                    params.append({"name": name, "nonfinite": bad, "numel": p.numel()})
                if p.grad is not None:
                    bad = int((~torch.isfinite(p.grad.detach())).sum().item())
                    if bad:
                        grads.append({"name": name, "nonfinite": bad, "numel": p.grad.numel()})
        return params, grads, checked


def _nonfinite(torch: Any, value: Any, device: Any) -> Any:
    """A 0-d bool tensor on `device`: does `value` (tensor, number or None) hold any NaN/Inf? No cast to
    float32 (a large float64 would turn into an Inf that was never there) and no host sync."""
    if value is None:
        return torch.zeros((), dtype=torch.bool, device=device)
    is_tensor = isinstance(value, torch.Tensor)
    tensor = value.detach() if is_tensor else torch.tensor(float(value), dtype=torch.float64)
    return (~torch.isfinite(tensor.to(device))).any()


def _fmt(value: Any) -> str | None:
    """A JSON-safe rendering ("nan", "inf", "1.2345"): JSON has no NaN, and the dump must stay valid."""
    if value is None:
        return None
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return str(value)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return f"{number:.6g}"

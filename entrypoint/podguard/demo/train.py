"""`python -m podguard.demo`: the demo training job (see the package docstring for what it shows).

Exit codes: 0 done; 64 bad option or config, or no torch in this Python (before torch is even imported);
1 the NaN guard stopped training; other PodguardError codes from init_rank (69 no GPU, 75 GPU busy, 76 GPU
failed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from podguard import console
from podguard.demo import data as demo_data
from podguard.demo import require_torch
from podguard.demo.checkpoint import DemoCheckpoints
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.launch.prepare import prepare_once
from podguard.rank import (
    NanGuard,
    NonFiniteError,
    RankContext,
    SaveRequest,
    build_config,
    heartbeat,
    init_rank,
    log_memory,
    serialized,
)
from podguard.rank._env import current_rank, emit
from podguard.rank.config import NAN_POLICIES, PRESETS, TrainConfig
from podguard.state import state_dir, subdir


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad options as a UsageError (exit 64, one line) instead of exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m podguard.demo", description="podguard's built-in demo training job.")
    p.add_argument("--preset", choices=tuple(PRESETS), help="ci (default: seconds on CPU), debug, production")
    p.add_argument("--config", metavar="FILE", help="JSON or TOML file of settings (keys as in the presets)")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int, help="samples per rank per step")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--log-every", type=int, help="print a progress line every N steps")
    p.add_argument("--seed", type=int, help="seed for the dataset and the model")
    p.add_argument("--nan-policy", choices=NAN_POLICIES, help="skip bad steps (stop after K in a row) or stop")
    p.add_argument("--nan-max-consecutive", type=int, help="K: consecutive bad steps before stopping")
    p.add_argument(
        "--inject-nan-at", metavar="STEP[-END]", help="make the loss NaN at this step (or range) to show the guard"
    )
    p.add_argument("--inject-nan-rank", type=int, help="rank whose loss goes NaN (default: the last rank)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="default: auto")
    p.add_argument("--allow-cpu-fallback", action="store_true", help="train on CPU if the GPU cannot be used")
    p.add_argument("--cache-dir", metavar="DIR", help="prepared-dataset cache (default: <state dir>/cache)")
    p.add_argument("--dump-dir", metavar="DIR", help="NaN dumps (default: <state dir>/nan)")
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        default=os.environ.get("PODGUARD_CHECKPOINTS") or None,
        help="save step-<N>.pt here (every --save-every steps and on podguard's save signal) and resume from "
        "PODGUARD_RESUME_FROM (default: PODGUARD_CHECKPOINTS, which `podguard train --checkpoints DIR` sets)",
    )
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints (0: only on the signal)")
    return p.parse_args(argv)


def parse_steps(text: str | None) -> set[int]:
    """ "7" -> {7}; "7-9" -> {7, 8, 9}; None -> empty."""
    if not text:
        return set()
    try:
        if "-" in text:
            first, last = (int(part) for part in text.split("-", 1))
        else:
            first = last = int(text)
    except ValueError:
        raise UsageError(f"--inject-nan-at {text!r} is not valid; use a step (7) or a range (7-9)") from None
    if first < 1 or last < first:
        raise UsageError(f"--inject-nan-at {text!r} is not valid; steps start at 1 and a range must not be reversed")
    return set(range(first, last + 1))


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    try:
        args = parse_args(argv)
        config = build_config(
            args.preset,
            args.config,
            {
                "steps": args.steps,
                "batch_size": args.batch_size,
                "lr": args.lr,
                "log_every": args.log_every,
                "seed": args.seed,
                "nan_policy": args.nan_policy,
                "nan_max_consecutive": args.nan_max_consecutive,
            },
        )
        inject = parse_steps(args.inject_nan_at)
        # the save signal's handler first: a request that came during start-up must not kill the job
        args.save_request = SaveRequest() if args.checkpoint_dir else None
        require_torch()  # one line naming torch and how to get it, not a traceback per rank
    except UsageError as exc:
        sys.stderr.write(f"podguard demo: error: {exc.message}\n")
        return exc.code

    ctx: RankContext | None = None
    rank = current_rank()
    try:
        log_memory("START")
        with serialized("import", slots=config.import_slots):
            warnings.filterwarnings("ignore", message=".*NumPy.*")  # CPU torch without numpy warns at import
            import torch  # noqa: PLC0415  lazy: torch under the cross-rank import lock
            import torch.distributed  # noqa: PLC0415  lazy: torch under the cross-rank import lock
            import torch.nn.parallel  # noqa: F401, PLC0415  lazy: torch under the cross-rank import lock
        log_memory("POST-IMPORT")
        ctx = init_rank(device=args.device, allow_cpu_fallback=args.allow_cpu_fallback)
        return _train(ctx, config, args, inject, started)
    except NonFiniteError:
        return ExitCode.FAILURE  # the guard has printed why, on every rank, and written its dump
    except PodguardError as exc:
        emit(f"[rank {rank}] ERROR: {exc.message}")
        return exc.code
    finally:
        if ctx is not None:
            ctx.shutdown()  # after _train returned: the DDP model it built is garbage by now


@dataclass
class _Run:
    """What the phases of one training run share."""

    ctx: RankContext
    config: TrainConfig
    args: argparse.Namespace
    inject: set[int]
    started: float
    device: Any = None
    x: Any = None  # this rank's shard of the dataset
    y: Any = None
    prepared_by: str = ""

    @property
    def inject_rank(self) -> int:
        return self.ctx.world_size - 1 if self.args.inject_nan_rank is None else self.args.inject_nan_rank


def _train(ctx: RankContext, config: TrainConfig, args: argparse.Namespace, inject: set[int], started: float) -> int:
    import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

    run = _Run(ctx, config, args, inject, started, device=torch.device(ctx.device))
    _limit_cpu_threads(ctx)
    _banner(run)
    _load_data(run)
    model, guard = _build_model(run)
    train_s, last_loss, ran = _train_loop(run, model, guard)
    _summary(run, model, guard, train_s, last_loss, ran)
    return ExitCode.OK


def _limit_cpu_threads(ctx: RankContext) -> None:
    """CPU ranks on one host share its cores: without this, each takes them all and they thrash."""
    import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

    if not ctx.is_cuda and "OMP_NUM_THREADS" not in os.environ:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or ctx.world_size)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))


def _banner(run: _Run) -> None:
    config, ctx = run.config, run.ctx
    if ctx.is_main:
        emit(
            f"[demo] preset={config.preset} steps={config.steps} batch={config.batch_size}/rank "
            f"(global {config.batch_size * ctx.world_size}) model=residual MLP {config.layers}x{config.hidden} "
            f"dataset={config.samples}x{config.input_dim} classes={config.classes} ranks={ctx.world_size} "
            f"device={run.device.type} backend={ctx.backend}"
            + (f" inject_nan_at={sorted(run.inject)} on rank {run.inject_rank}" if run.inject else "")
        )


def _load_data(run: _Run) -> None:
    """The dataset, prepared once per node (ranks wait on the prepare lock instead of racing); this rank's shard."""
    config, rank, world = run.config, run.ctx.rank, run.ctx.world_size
    spec = demo_data.SyntheticDataset(config.samples, config.input_dim, config.classes, config.seed)
    cache_root = Path(run.args.cache_dir) if run.args.cache_dir else _state_subdir("cache")
    with console.tagged(f"rank {rank}"):  # 'podguard: rank 0: prepare ...'
        prepared = prepare_once(spec, cache_root=cache_root, key_parts=spec.key_parts())
    emit(
        f"[rank {rank}] DATA: {'cache hit' if prepared.cache_hit else 'prepared'} ({prepared.prepared_by}) "
        f"{prepared.path} waited {prepared.waited_s:.2f}s ran {prepared.run_s:.2f}s"
    )
    x_all, y_all = demo_data.load(prepared.path)
    run.x, run.y = x_all[rank::world].to(run.device), y_all[rank::world].to(run.device)
    if len(run.x) == 0:  # more ranks than samples: share the whole set
        run.x, run.y = x_all.to(run.device), y_all.to(run.device)
    run.prepared_by = prepared.prepared_by


def _build_model(run: _Run) -> tuple[Any, NanGuard]:
    import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

    from podguard.demo.model import DemoNet  # noqa: PLC0415  lazy: imports torch at its top

    config, ctx = run.config, run.ctx
    torch.manual_seed(config.seed)  # same init everywhere (DDP also broadcasts rank 0's weights)
    model: Any = DemoNet(config.input_dim, config.hidden, config.layers, config.classes).to(run.device)
    params = sum(p.numel() for p in model.parameters())
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

        model = DistributedDataParallel(model, device_ids=[run.device.index] if ctx.is_cuda else None)
    guard = NanGuard(
        model, max_consecutive=config.nan_max_consecutive, policy=config.nan_policy, dump_dir=run.args.dump_dir
    )
    log_memory("POST-MODEL")
    if ctx.is_main:
        emit(f"[demo] model has {params:,} parameters; training")
    return model, guard


def _train_loop(run: _Run, model: Any, guard: NanGuard) -> tuple[float, float, int]:
    """The steps, with a progress line every `log_every`; (training seconds, last logged loss, steps run here: fewer
    than the total after a resume)."""
    import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock
    import torch.nn.functional as F  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

    config, rank = run.config, run.ctx.rank
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed * 7919 + rank)  # batch sampling: different per rank
    ckpt = DemoCheckpoints(run.args, run.ctx, run.device)
    first = ckpt.resume(model, optimizer, gen)  # 1, or the step after the checkpoint podguard handed over
    train_started = time.monotonic()
    last_loss = float("nan")
    global_batch = config.batch_size * run.ctx.world_size
    ran = 0
    for step in range(first, config.steps + 1):
        ran += 1
        idx = torch.randint(len(run.x), (config.batch_size,), generator=gen).to(run.device)
        loss = F.cross_entropy(model(run.x[idx]), run.y[idx])
        if step in run.inject and rank == run.inject_rank:
            loss = loss * float("nan")
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        if guard.check(step, loss.detach(), grad_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # always: a skipped step's gradients must not leak into the next
        heartbeat(step)  # per-rank progress for podguard's hang watch (a memory store; a no-op outside podguard)
        if ckpt.after_step(step, model, optimizer, gen):  # every --save-every steps, and on podguard's save signal
            emit(f"[rank {rank}] stopping at step {step}: saved before podguard stops the job")
            run.config = replace(config, steps=step)  # the summary counts the steps done
            last_loss = float(loss.item())
            break
        if step % config.log_every == 0 or step == config.steps:
            last_loss = float(loss.item())
            elapsed = time.monotonic() - train_started
            done = step - first + 1
            rate = global_batch * done / elapsed if elapsed > 0 else 0.0
            eta = (config.steps - step) * elapsed / done
            emit(
                f"[rank {rank}] step {step}/{config.steps} loss {last_loss:.4f} | {rate:,.0f} samples/s | "
                f"ETA {_clock(eta)} | skipped {len(guard.skipped_steps)}"
            )
    if run.ctx.is_cuda:
        torch.cuda.synchronize(run.device)
    return time.monotonic() - train_started, last_loss, ran


def _summary(run: _Run, model: Any, guard: NanGuard, train_s: float, last_loss: float, ran: int) -> None:
    """Loss and accuracy averaged over ranks, printed by rank 0."""
    import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

    ctx, config = run.ctx, run.config
    model.eval()
    with torch.no_grad():
        probe = min(len(run.x), 4096)
        accuracy = (model(run.x[:probe]).argmax(dim=1) == run.y[:probe]).float().mean()
    stats = torch.tensor([last_loss, float(accuracy)], dtype=torch.float64, device=run.device)
    if ctx.distributed:
        import torch.distributed as dist  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

        dist.all_reduce(stats)
        stats /= ctx.world_size
    log_memory("END")
    if ctx.is_main:
        final_loss, final_acc = stats.tolist()
        global_batch = config.batch_size * ctx.world_size
        rate = global_batch * ran / train_s if ran and train_s > 0 else 0.0  # the steps run here, not resumed ones
        loss = f"{final_loss:.4f}" if ran else "n/a (resumed at the last step: nothing left to train)"
        emit(
            f"[demo] DONE steps={config.steps} final_loss={loss} accuracy={final_acc * 100:.1f}% "
            f"time={time.monotonic() - run.started:.1f}s (train {train_s:.1f}s) "
            f"samples/s={rate:,.0f} skipped={len(guard.skipped_steps)} "
            f"ranks={ctx.world_size} device={run.device.type} backend={ctx.backend} "
            f"dataset={_DATA_ORIGIN.get(run.prepared_by, run.prepared_by)}"
        )


_DATA_ORIGIN = {
    "this process": "prepared",
    "another process": "prepared by another rank",
    "cache": "cache hit",
    "node 0": "prepared by node 0",
}


def _state_subdir(name: str) -> Path:
    return subdir(state_dir(), name)


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

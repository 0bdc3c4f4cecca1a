"""One attempt of a job: a free port, the prepare-once step, the mode's workers under supervision and the watches.

    result = run_attempt(cfg, opts, selection, base, key, extra_env, guards, attempt=0)
    result.code, result.outcome, result.runtime.progress.progressed

The attempt's workers get PODGUARD_RUN_DIR, PODGUARD_STATE_DIR, PODGUARD_RESTART_COUNT (0 on the first attempt),
the heartbeat board and, with a hang timeout, torch's flight recorder settings; with `--checkpoints` also
PODGUARD_CHECKPOINTS and the newest whole checkpoint (PODGUARD_RESUME_FROM/_STEP, job/handoff.py). The run-time
watch (hangs, GPU faults, stragglers: launch/watch/) and the billing guards (with `--save-signal`, a save request
before they end the job: guards/save.py) watch from the supervisor's loop; the outcome is recorded for the restart
guard (job/restart_guard.py). `accelerate launch` gets the leased port as --main_process_port (job/accelerate.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.errors import UsageError
from podguard.gpu.selected import Selection
from podguard.job import restart_guard
from podguard.job.accelerate import with_main_process_port
from podguard.launch import modes
from podguard.launch.config import JobConfig, LaunchMode
from podguard.launch.job_env import line_buffering_env
from podguard.launch.line_shims import buffering_warnings
from podguard.launch.modes import pick_mode
from podguard.launch.ports import allocate_master_port
from podguard.launch.prefix import prefix_pattern, prefix_rank_pattern
from podguard.launch.run import run_job
from podguard.launch.spec import JobOutcome
from podguard.launch.summary import format_summary
from podguard.launch.watch.group import WatchGroup
from podguard.launch.watch.runtime import RuntimeSettings, RuntimeWatch
from podguard.preflight.options import PreflightOptions
from podguard.state import subdir

if TYPE_CHECKING:
    from podguard.guards import GuardWatch
    from podguard.guards.save import SaveBeforeStop
    from podguard.job.handoff import AttemptCheckpoints, Handoff
    from podguard.job.options import CheckpointSettings, JobSettings
    from podguard.launch.supervisor import Watch
    from podguard.metrics import Metrics

__all__ = ["ENV_RESTART_COUNT", "AttemptResult", "run_attempt"]

ENV_RESTART_COUNT = "PODGUARD_RESTART_COUNT"


@dataclass(frozen=True)
class AttemptResult:
    code: int
    outcome: JobOutcome
    record: Path | None  # the job's outcome record (the restart guard's file)
    runtime: RuntimeWatch
    duration_s: float
    mode: LaunchMode
    explained: str = ""  # what the watches added to the supervisor's account (a GPU fault as the root cause)
    checkpoints: AttemptCheckpoints | None = None  # --checkpoints: what it started from, the newest at its end


def run_attempt(
    settings: JobSettings,
    opts: PreflightOptions,
    selection: Selection,
    base: Path,
    key: str,
    extra_env: dict[str, str],
    guards: GuardWatch | None,
    *,
    attempt: int,
    metrics: Metrics | None = None,
    handoff: Handoff | None = None,
) -> AttemptResult:
    """Port, prepare, the workers under supervision and watch, the outcome record. With `handoff`
    (`--checkpoints`) the workers get PODGUARD_RESUME_FROM/_STEP (job/handoff.py). On a multi-node run with a
    hang timeout the nodes share their progress on the cluster gate's store (a hang is the job's verdict)."""
    cfg = settings.launch
    checkpoints = settings.checkpoints
    started, t0 = time.time(), time.monotonic()
    run_dir = _run_dir(base)
    env: dict[str, str] = {
        **extra_env,
        "PODGUARD_RUN_DIR": str(run_dir),
        "PODGUARD_STATE_DIR": str(base),
        ENV_RESTART_COUNT: str(attempt),
    }
    if handoff is not None:
        env.update(handoff.before())  # says `resuming from ...` (or `no checkpoint yet in DIR`)
    if checkpoints is not None and checkpoints.save_signal is not None:  # the callbacks (integrations/) listen
        env["PODGUARD_SAVE_SIGNAL"] = signal.Signals(checkpoints.save_signal).name
    mode = _pick_mode(cfg, selection, announce=attempt == 0)
    if attempt == 0:  # a C++ program whose std::cout podguard cannot keep line by line (launch/line_shims.py)
        for warning in buffering_warnings(cfg.argv, {**os.environ, **line_buffering_env()}):
            console.warn(warning)
    runtime = RuntimeWatch(_runtime_settings(settings, opts, selection, mode), run_dir)
    env.update(runtime.worker_env(slots=max(len(selection.gpus), cfg.options.cpu_workers or 0, 1)))
    port_lease = None
    try:
        port = cfg.options.master_port
        # single mode: a script that spawns its own ranks (mp.spawn, a shell loop) needs a port of its own
        # too, unless the user's environment gives one
        single_port = mode is LaunchMode.SINGLE and not os.environ.get("MASTER_PORT")
        if (
            single_port
            or mode in (LaunchMode.PER_GPU, LaunchMode.ROLES)
            or (mode is LaunchMode.TORCHRUN and port is not None and not cfg.multi_node)
        ):
            port_lease = allocate_master_port(port, command=opts.extra.get("command_line"))
            port = port_lease.port
        if single_port and port is not None:
            env["MASTER_PORT"] = str(port)
            if not os.environ.get("MASTER_ADDR"):
                env["MASTER_ADDR"] = cfg.options.master_addr or "127.0.0.1"
        cfg = _lease_to_accelerate(cfg, port, announce=attempt == 0)
        if cfg.prepare_argv is not None:
            env.update(_prepare(cfg, base, env))
        watches: list[Watch | None] = [runtime]
        if guards is not None:
            if attempt == 0:
                guards.watch_gpus(selection.indices)  # a CPU-only run: --idle-stop is ignored with one warning
                if description := guards.describe():
                    console.say(description)
            watches.insert(0, guards.supervised(_save_before_stop(checkpoints, runtime, handoff)))
        if metrics is not None:  # last: it takes the run-time watch's state, its final poll included
            watches.append(metrics.attempt(runtime, attempt=attempt, mode=mode, gpus=selection.gpus))
        told = _run_mode(mode, cfg, selection, env, port, run_dir, WatchGroup(watches))
        outcome = runtime.explain(told)
        seen = handoff.after(run_dir) if handoff is not None else None
        record = restart_guard.record_outcome(
            outcome if seen is None else replace(outcome, detail=_joined(seen.fragment(), outcome.detail)),
            key=key,
            argv=cfg.job_argv,
            mode=mode,
            started_at=started,
            state=base,
            root_cause=runtime.root_cause(outcome),
        )
        console.say(f"logs: {run_dir}")
        explained = outcome.detail if outcome.detail != told.detail else ""
        duration = time.monotonic() - t0
        return AttemptResult(outcome.exit_code, outcome, record, runtime, duration, mode, explained, seen)
    finally:
        if port_lease is not None:
            port_lease.release()


def _joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _lease_to_accelerate(cfg: JobConfig, port: int | None, *, announce: bool) -> JobConfig:
    """`accelerate launch` takes its port only from --main_process_port (job/accelerate.py): give it the lease."""
    if port is None:  # no lease: the user's own MASTER_PORT, which accelerate would ignore as well
        raw = os.environ.get("MASTER_PORT", "").strip()
        if not raw.isdigit():
            return cfg
        port = int(raw)
    argv = with_main_process_port(cfg.argv, port)
    if argv == cfg.argv:
        return cfg
    if announce:
        console.say(f"accelerate launch: --main_process_port {port} (the port podguard leased for this job)")
    return replace(cfg, argv=argv)


def _save_before_stop(
    checkpoints: CheckpointSettings | None, runtime: RuntimeWatch, handoff: Handoff | None
) -> SaveBeforeStop | None:
    """`--save-signal`: the save request a billing guard makes before it ends the job (guards/save.py). A job
    that the hang watch finds silent past --hang-timeout is hung: it is not asked. While podguard waits for the
    save, the hang clock stands still (the save may be silent), up to --save-grace."""
    if checkpoints is None or checkpoints.save_signal is None:
        return None
    from podguard.guards.save import SaveBeforeStop, SaveSettings  # noqa: PLC0415  lazy: the save guard, only with --save-signal (`podguard run` loads none)

    def hung() -> bool:
        return runtime.hang is not None or runtime.progress.check(time.monotonic()) is not None

    settings = SaveSettings(checkpoints.save_signal, checkpoints.save_grace_s, checkpoints.folder)
    save = SaveBeforeStop(settings, hung, clock=runtime)
    if handoff is not None and handoff.store is not None:  # --checkpoint-store: its upload is waited for too
        save.store = handoff.store.upload_wait()
    return save


def _runtime_settings(
    settings: JobSettings, opts: PreflightOptions, selection: Selection, mode: LaunchMode
) -> RuntimeSettings:
    hang_timeout_s, progress = settings.hang_timeout_s, settings.progress
    line_prefix = line_rank = None
    if mode is LaunchMode.TORCHRUN:  # the ranks' lines reach the watch through torchrun with the wrapper's prefix
        from podguard.rank.wrap import DEFAULT_RANK_PREFIX  # noqa: PLC0415  lazy: the rank wrapper (its own process), torchrun mode only

        line_prefix = prefix_pattern(DEFAULT_RANK_PREFIX)
        line_rank = prefix_rank_pattern(DEFAULT_RANK_PREFIX)
    return RuntimeSettings(
        hang_timeout_s=hang_timeout_s,
        progress=re.compile(progress) if progress else None,
        slow_ratio=opts.slow_ratio,
        gpus=tuple((g.index, g.uuid) for g in dict.fromkeys(selection.gpus)),
        slot_gpus={slot: g.index for slot, g in enumerate(selection.gpus)},
        python=_job_python(settings.launch.argv),
        line_prefix=line_prefix,
        line_rank=line_rank,
        cluster=settings.gate if hang_timeout_s is not None else None,
    )


def _job_python(argv: tuple[str, ...]) -> str | None:
    """The interpreter a `python ...` command runs (its torch is the job's), or None: podguard's own."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return None
    return shutil.which(argv[0]) or argv[0]


def _run_dir(base: Path) -> Path:
    """`<state>/runs/<time>-<pid>`; a temp folder (with a warning) when the volume cannot take it (full)."""
    name = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}-{time.monotonic_ns() % 10**6:06d}"
    try:
        return subdir(subdir(base, "runs"), name)
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix=f"podguard-run-{name}-"))
        console.warn(f"cannot create a run folder in {base / 'runs'} ({exc.strerror}); logs: {fallback}")
        return fallback


def _pick_mode(cfg: JobConfig, selection: Selection, *, announce: bool = True) -> LaunchMode:
    if cfg.mode is not LaunchMode.AUTO:
        return cfg.mode
    if cfg.multi_node:
        if announce:
            console.say(f"mode auto -> torchrun: {cfg.options.nnodes} nodes (one rank per GPU on each)")
        return LaunchMode.TORCHRUN
    choice = pick_mode(cfg.argv, selection)
    if announce:
        console.say(choice.reason)
    return LaunchMode(choice.mode)


def _run_mode(
    mode: LaunchMode,
    cfg: JobConfig,
    selection: Selection,
    env: dict[str, str],
    port: int | None,
    run_dir: Path,
    watch: Watch | None = None,
) -> JobOutcome:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    only_gpu = cfg.options.only_gpu
    only: set[str] | None = None
    if mode is LaunchMode.ROLES:
        from podguard.launch import roles  # noqa: PLC0415  lazy: the TOML parser and the threaded controller, roles mode only

        assert cfg.options.job_file is not None and port is not None
        plan = roles.load_roles(cfg.options.job_file, selection, master_port=port, log_dir=logs)
        if only_gpu is not None:
            only = modes.only_for_gpu(plan.specs(), only_gpu)
        return roles.run_roles(
            plan, selection, master_port=port, log_dir=logs, grace_s=cfg.grace_s, only=only, watch=watch
        )
    if mode is LaunchMode.TORCHRUN:
        return _run_torchrun(cfg, selection, env, port, run_dir, watch)
    if mode is LaunchMode.SINGLE:
        specs = [modes.single_spec(cfg.argv, selection, log_dir=logs, env=env)]
    else:
        assert port is not None
        specs = modes.per_gpu_specs(
            cfg.argv,
            selection,
            master_port=port,
            master_addr=cfg.options.master_addr or "127.0.0.1",
            prefix_format=cfg.options.prefix,
            log_dir=logs,
            nproc=cfg.options.cpu_workers,
            env=env,
        )
        if only_gpu is not None:
            only = modes.only_for_gpu(specs, only_gpu)
    return run_job(specs, grace_s=cfg.grace_s, only=only, watch=watch)


def _run_torchrun(
    cfg: JobConfig, selection: Selection, env: dict[str, str], port: int | None, run_dir: Path, watch: Watch | None
) -> JobOutcome:
    from podguard.launch.torchrun.command import build_torchrun_spec  # noqa: PLC0415  lazy: torchrun mode only (`podguard run` loads no torchrun module)
    from podguard.launch.torchrun.failure import explain_torchrun_failure  # noqa: PLC0415  lazy: torchrun mode only (`podguard run` loads no torchrun module)

    opts = cfg.options
    errors = run_dir / "torchrun"
    spec = build_torchrun_spec(
        list(cfg.argv),
        selection,
        nnodes=opts.nnodes,
        node_rank=opts.node_rank,
        master_addr=opts.master_addr,
        master_port=port,
        max_restarts=opts.max_restarts,
        error_dir=errors,
        log_dir=run_dir / "logs",
        extra_env=env,
        nproc=opts.cpu_workers,
        only_local_ranks=None if opts.only_gpu is None else _local_ranks_of(selection, opts.only_gpu),
        shutdown_timeout_s=max(cfg.grace_s - 1.0, 1.0),
        rdzv_backend=opts.rdzv_backend,
    )
    outcome = explain_torchrun_failure(run_job([spec], grace_s=cfg.grace_s, summary=False, watch=watch), errors)
    for line in format_summary(outcome).splitlines():  # `podguard: `-prefixed, as the other modes' summaries
        console.say(line)
    return outcome


def _local_ranks_of(selection: Selection, gpu: int) -> list[int]:
    ranks = [pos for pos, g in enumerate(selection.gpus) if g.index == gpu]
    if selection.gpus and not ranks:
        raise UsageError(f"--only-gpu={gpu}: GPU {gpu} is not selected; selected: {list(selection.indices)}")
    return ranks or [gpu]


def _prepare(cfg: JobConfig, base: Path, env: dict[str, str]) -> dict[str, str]:
    from podguard.launch.prepare import prepare_once  # noqa: PLC0415  lazy: --prepare only (`podguard run` loads none)

    assert cfg.prepare_argv is not None
    result = prepare_once(
        list(cfg.prepare_argv),
        cache_root=base / "prepare",
        key_parts=cfg.cache_key,
        env={**os.environ, **env},
        shared_storage=cfg.options.prepare_shared,
        node_rank=cfg.options.node_rank,
    )
    return {"PODGUARD_PREPARE_DIR": str(result.path)}

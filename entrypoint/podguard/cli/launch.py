"""`podguard train`, `podguard run` and `podguard sweep`: preflight, then launch and supervise.

The order matters and is the product's promise:
1. validate every option (exit 64 before anything is touched);
2. crash-loop guard (a restarted container does not re-run a finished job or crash-loop);
3. preflight: select, lease the GPUs (so concurrent runs never collide or "clean up" each other),
   clean up leftover holders, gate;
4. a free MASTER_PORT, the prepare-once step;
5. launch in the chosen mode, supervise to the end (fail fast, signals), record the outcome;
6. `--on-exit`.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from podguard.cli import params as o
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.launch.spec import JobOutcome
from podguard.preflight.pipeline import PreflightOptions, run_preflight
from podguard.preflight.selection import Selection, parse_count

LAUNCH = "Launch"
MODES = ("auto", "single", "per-gpu", "torchrun", "roles")
DEMO_CPU_WORKERS = 2

Command = Annotated[list[str] | None, typer.Argument(help="The command to run, after `--`.", show_default=False)]
Mode = Annotated[
    str,
    typer.Option(
        "--mode",
        envvar="PODGUARD_MODE",
        help="auto, single (one process, all selected GPUs), per-gpu (one process per GPU), torchrun, "
        "roles (a --job-file splits GPUs between roles).",
        rich_help_panel=LAUNCH,
    ),
]
OnlyGpu = Annotated[
    str | None,
    typer.Option(
        "--only-gpu",
        envvar="PODGUARD_ONLY_GPU",
        help="Show only this GPU's (or rank's) lines on the terminal; every line still goes to the log files.",
        rich_help_panel=LAUNCH,
    ),
]
PrefixFormat = Annotated[
    str | None,
    typer.Option(
        "--prefix",
        envvar="PODGUARD_PREFIX",
        help="Per-line prefix of per-gpu workers (default 'GPU{gpu}:', 'CPU{rank}:' without GPUs); fields: gpu, "
        "rank, local_rank, name.",
        rich_help_panel=LAUNCH,
    ),
]
OnExit = Annotated[
    str,
    typer.Option(
        "--on-exit",
        envvar="PODGUARD_ON_EXIT",
        help="After the job: exit (with its code), idle (keep the container alive), stop-pod.",
        rich_help_panel=LAUNCH,
    ),
]
Rerun = Annotated[
    bool,
    typer.Option(
        "--rerun",
        envvar="PODGUARD_RERUN",
        help="Run again after a container restart even though the job already finished successfully.",
        rich_help_panel=LAUNCH,
    ),
]
Prepare = Annotated[
    str | None,
    typer.Option(
        "--prepare",
        envvar="PODGUARD_PREPARE",
        help="A command run once before any worker starts (cached by --cache-key; it writes to "
        "$PODGUARD_PREPARE_DIR, which workers also get).",
        rich_help_panel=LAUNCH,
    ),
]
CacheKey = Annotated[
    list[str] | None,
    typer.Option(
        "--cache-key",
        envvar="PODGUARD_CACHE_KEY",
        help="KEY=VALUE that identifies the prepared data (model, dataset, context length, samples...); repeatable.",
        rich_help_panel=LAUNCH,
    ),
]
PrepareShared = Annotated[
    bool,
    typer.Option(
        "--prepare-shared",
        envvar="PODGUARD_PREPARE_SHARED",
        help="The prepare cache is on storage shared by all nodes: only node 0 prepares.",
        rich_help_panel=LAUNCH,
    ),
]
WaitForGpus = Annotated[
    bool,
    typer.Option(
        "--wait-for-gpus",
        envvar="PODGUARD_WAIT_FOR_GPUS",
        help="Wait (up to --busy-timeout) for GPUs leased by another podguard run instead of refusing (75).",
        rich_help_panel=LAUNCH,
    ),
]
JobFile = Annotated[
    Path | None,
    typer.Option("--job-file", envvar="PODGUARD_JOB_FILE", help="Roles job file (TOML).", rich_help_panel=LAUNCH),
]
Nproc = Annotated[
    str | None,
    typer.Option(
        "--cpu-workers",
        envvar="PODGUARD_CPU_WORKERS",
        help="Workers to start on a node without GPUs (per-gpu and torchrun modes; the demo defaults to 2).",
        rich_help_panel=LAUNCH,
    ),
]
Nnodes = Annotated[
    str | None,
    typer.Option(
        "--nnodes",
        envvar=["PODGUARD_NNODES", "NUM_NODES"],
        help="Nodes in a multi-node torchrun job (default NUM_NODES).",
        rich_help_panel=LAUNCH,
    ),
]
NodeRank = Annotated[
    str | None,
    typer.Option(
        "--node-rank",
        envvar=["PODGUARD_NODE_RANK", "NODE_RANK"],
        help="This node's rank (default NODE_RANK).",
        rich_help_panel=LAUNCH,
    ),
]
MasterAddr = Annotated[
    str | None,
    typer.Option(
        "--master-addr",
        envvar=["PODGUARD_MASTER_ADDR", "PRIMARY_ADDR", "MASTER_ADDR"],
        help="Rendezvous host (default PRIMARY_ADDR / MASTER_ADDR).",
        rich_help_panel=LAUNCH,
    ),
]
MasterPort = Annotated[
    str | None,
    typer.Option(
        "--master-port",
        envvar=["PODGUARD_MASTER_PORT", "PRIMARY_PORT", "MASTER_PORT"],
        help="Rendezvous port (default: a free port distinct from other podguard runs).",
        rich_help_panel=LAUNCH,
    ),
]
MaxRestarts = Annotated[
    str,
    typer.Option(
        "--max-restarts",
        envvar="PODGUARD_MAX_RESTARTS",
        help="torchrun mode: worker group restarts before failing.",
        rich_help_panel=LAUNCH,
    ),
]


def register(app: typer.Typer, only: str | None = None) -> None:
    for name, func in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(func)


# --------------------------------------------------------------------------------------------------
# launch configuration, validated before anything is done
# --------------------------------------------------------------------------------------------------


class LaunchConfig:
    """Every launch option, validated up front so a mistake costs nothing (no kill, no lease)."""

    def __init__(
        self,
        *,
        argv: list[str],
        demo: bool,
        mode: str,
        only_gpu: str | None,
        prefix: str | None,
        on_exit: str,
        rerun: bool,
        prepare: str | None,
        cache_key: list[str] | None,
        prepare_shared: bool,
        job_file: Path | None,
        cpu_workers: str | None,
        nnodes: str | None,
        node_rank: str | None,
        master_addr: str | None,
        master_port: str | None,
        max_restarts: str,
        grace: float,
    ) -> None:
        from podguard.launch.lifecycle import validate_on_exit

        self.argv = argv
        self.demo = demo
        mode = mode.strip().lower()
        if mode not in MODES:
            raise UsageError(f"--mode={mode!r} is not valid; choose one of: {', '.join(MODES)}")
        if mode == "roles" and job_file is None:
            raise UsageError("--mode=roles needs --job-file FILE (a TOML file that splits the GPUs between roles)")
        if job_file is not None:
            if mode not in ("auto", "roles"):
                raise UsageError(f"--job-file is only valid with --mode=roles, not --mode={mode}")
            if not job_file.is_file():
                raise UsageError(f"--job-file={str(job_file)!r} does not exist or is not a file")
            if argv:
                raise UsageError("give either --job-file or a command after `--`, not both")
            mode = "roles"
        if not argv and mode not in ("roles",) and not demo:
            raise UsageError("no command given; put it after `--`, e.g. `podguard run -- python serve.py`")
        self.mode = mode
        self.only_gpu = only_gpu.strip() if only_gpu else None
        if self.only_gpu is not None and not self.only_gpu.isdigit():
            raise UsageError(f"--only-gpu={only_gpu!r} is not valid; expected a GPU index such as 2")
        if prefix is not None:
            from podguard.launch.modes import PREFIX_FIELDS, check_format

            check_format(prefix, PREFIX_FIELDS, "--prefix")
        self.prefix = prefix
        self.on_exit = validate_on_exit(on_exit)
        if self.on_exit == "stop-pod":
            raise UsageError(
                "--on-exit=stop-pod needs the RunPod integration, which is not available yet; use exit or idle"
            )
        self.rerun = rerun
        self.prepare_argv: list[str] | None = None
        if prepare is not None:
            try:
                self.prepare_argv = shlex.split(prepare)
            except ValueError as exc:
                raise UsageError(f"--prepare={prepare!r} cannot be parsed: {exc}") from None
            if not self.prepare_argv:
                raise UsageError("--prepare is empty; give the command that prepares the data")
        self.cache_key: dict[str, str] = {}
        for item in cache_key or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"--cache-key={item!r} is not valid; expected KEY=VALUE, e.g. dataset=gsm8k")
            self.cache_key[key.strip()] = value
        if self.cache_key and self.prepare_argv is None:
            raise UsageError("--cache-key only makes sense with --prepare CMD")
        self.prepare_shared = prepare_shared
        self.job_file = job_file
        self.cpu_workers = parse_count(cpu_workers, "--cpu-workers", minimum=1)
        self.nnodes = parse_count(nnodes, "--nnodes/NUM_NODES", minimum=1)
        self.node_rank = parse_count(node_rank, "--node-rank/NODE_RANK", minimum=0)
        if self.nnodes is not None and self.node_rank is not None and self.node_rank >= self.nnodes:
            raise UsageError(
                f"NODE_RANK={self.node_rank} is out of range for NUM_NODES={self.nnodes}; valid: 0-{self.nnodes - 1}"
            )
        self.master_addr = master_addr or None
        self.master_port = None
        if master_port not in (None, ""):
            from podguard.launch.torchrun.command import parse_port

            self.master_port = parse_port(master_port, "MASTER_PORT")
        self.max_restarts = o.parse_int(max_restarts, "--max-restarts")
        self.grace = grace
        if self.mode == "torchrun" or self.multi_node:
            from podguard.launch.torchrun.command import resolve_rendezvous

            resolve_rendezvous(
                os.environ,
                nnodes=self.nnodes,
                node_rank=self.node_rank,
                master_addr=self.master_addr,
                master_port=self.master_port,
                rdzv_id=None,
            )
        if self.multi_node and self.mode not in ("torchrun", "auto"):
            raise UsageError(f"multi-node (NUM_NODES={self.nnodes}) needs --mode=torchrun, not --mode={self.mode}")

    @property
    def multi_node(self) -> bool:
        return (self.nnodes or 1) > 1


def _check_against_selection(cfg: LaunchConfig) -> Callable[[Selection], None]:
    """Checks that need the selection (roles GPU split); run by the preflight before any lease or kill."""

    def check(selection: Selection) -> None:
        if cfg.mode == "roles":
            from podguard.launch.modes import load_roles

            assert cfg.job_file is not None
            load_roles(cfg.job_file, selection, master_port=cfg.master_port or 29500)

    return check


# --------------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------------


def train(
    command: Command = None,
    mode: Mode = "auto",
    only_gpu: OnlyGpu = None,
    prefix: PrefixFormat = None,
    on_exit: OnExit = "exit",
    rerun: Rerun = False,
    prepare: Prepare = None,
    cache_key: CacheKey = None,
    prepare_shared: PrepareShared = False,
    wait_for_gpus: WaitForGpus = False,
    job_file: JobFile = None,
    cpu_workers: Nproc = None,
    nnodes: Nnodes = None,
    node_rank: NodeRank = None,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    max_restarts: MaxRestarts = "0",
    gpu_list: o.GpuList = None,
    nproc_per_node: o.NprocPerNode = None,
    expect_gpus: o.ExpectGpus = None,
    on_fewer: o.OnFewer = "fail",
    require_gpu: o.RequireGpu = False,
    cleanup: o.Cleanup = True,
    busy_timeout: o.BusyTimeout = "60",
    grace: o.Grace = "7",
    protect: o.Protect = None,
    kill_pattern: o.KillPattern = None,
    idle_memory_mib: o.IdleMemory = "512",
    probe: o.Probe = "auto",
    probe_cmd: o.ProbeCmd = None,
    probe_timeout: o.ProbeTimeout = "60",
    temperature_margin: o.TempMargin = "0",
    fail_on_warnings: o.FailOnWarnings = False,
    state_dir: o.StateDir = None,
    dev_dir: o.DevDir = Path("/dev"),
) -> None:
    """Preflight, then launch CMD and supervise it to the end. Without CMD: the built-in demo training job."""
    argv = list(command or [])
    demo = not argv and job_file is None
    if demo:
        argv = [sys.executable, "-m", "podguard.demo"]
        if mode == "auto":
            mode = "per-gpu"
        if cpu_workers is None:
            cpu_workers = str(DEMO_CPU_WORKERS)
    cfg = LaunchConfig(
        argv=argv,
        demo=demo,
        mode=mode,
        only_gpu=only_gpu,
        prefix=prefix,
        on_exit=on_exit,
        rerun=rerun,
        prepare=prepare,
        cache_key=cache_key,
        prepare_shared=prepare_shared,
        job_file=job_file,
        cpu_workers=cpu_workers,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        max_restarts=max_restarts,
        grace=o.parse_seconds(grace, "--grace"),
    )
    opts = o.options_from("train", locals())
    raise typer.Exit(launch(cfg, opts, wait_for_gpus=wait_for_gpus))


def run(
    command: Command = None,
    only_gpu: OnlyGpu = None,
    on_exit: OnExit = "exit",
    wait_for_gpus: WaitForGpus = False,
    gpu_list: o.GpuList = None,
    nproc_per_node: o.NprocPerNode = None,
    expect_gpus: o.ExpectGpus = None,
    on_fewer: o.OnFewer = "fail",
    require_gpu: o.RequireGpu = False,
    cleanup: o.Cleanup = True,
    busy_timeout: o.BusyTimeout = "60",
    grace: o.Grace = "7",
    protect: o.Protect = None,
    kill_pattern: o.KillPattern = None,
    idle_memory_mib: o.IdleMemory = "512",
    probe: o.Probe = "auto",
    probe_cmd: o.ProbeCmd = None,
    probe_timeout: o.ProbeTimeout = "60",
    temperature_margin: o.TempMargin = "0",
    fail_on_warnings: o.FailOnWarnings = False,
    state_dir: o.StateDir = None,
    dev_dir: o.DevDir = Path("/dev"),
) -> None:
    """The same preflight for any command (an inference server, a notebook), then run and supervise it."""
    cfg = LaunchConfig(
        argv=list(command or []),
        demo=False,
        mode="single",
        only_gpu=only_gpu,
        prefix=None,
        on_exit=on_exit,
        rerun=True,  # `run` starts services: a restarted container must start them again
        prepare=None,
        cache_key=None,
        prepare_shared=False,
        job_file=None,
        cpu_workers=None,
        nnodes=None,
        node_rank=None,
        master_addr=None,
        master_port=None,
        max_restarts="0",
        grace=o.parse_seconds(grace, "--grace"),
    )
    opts = o.options_from("run", locals())
    raise typer.Exit(launch(cfg, opts, wait_for_gpus=wait_for_gpus))


def sweep(
    command: Command = None,
    gpus_per_run: str = typer.Option(..., "--gpus-per-run", envvar="PODGUARD_GPUS_PER_RUN", help="GPUs per run."),
    runs: str | None = typer.Option(
        None, "--runs", envvar="PODGUARD_RUNS", help="How many runs (default: as many as fit on the node)."
    ),
    name: str | None = typer.Option(None, "--name", envvar="PODGUARD_SWEEP_NAME", help="Sweep name (for logs)."),
    gpu_list: o.GpuList = None,
    grace: o.Grace = "7",
    state_dir: o.StateDir = None,
) -> None:
    """Launch N concurrent `podguard train` runs of K GPUs each on this node (disjoint GPUs, distinct ports)."""
    from podguard.launch.sweep import plan_sweep, run_sweep
    from podguard.preflight.inventory import read_inventory
    from podguard.preflight.selection import select_gpus
    from podguard.state import state_dir as resolve_state

    argv = list(command or [])
    base = resolve_state(state_dir)
    _, snaps = read_inventory()
    selection = select_gpus(snaps, gpu_list=gpu_list, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if selection.cpu_only:
        raise PodguardError("a sweep splits GPUs between runs, but this node has no GPU", ExitCode.GPUS_MISSING)
    plan = plan_sweep(list(selection.indices), gpus_per_run, runs)
    result = run_sweep(plan, argv, name=name, log_dir=base / "sweeps", grace_s=o.parse_seconds(grace, "--grace"))
    raise typer.Exit(result.exit_code)


# --------------------------------------------------------------------------------------------------
# the launch itself
# --------------------------------------------------------------------------------------------------


def launch(cfg: LaunchConfig, opts: PreflightOptions, *, wait_for_gpus: bool) -> int:
    """Steps 2-6 of the module docstring. Returns the process exit code."""
    from dataclasses import replace

    from podguard.launch import lifecycle as oc
    from podguard.state import state_dir as resolve_state
    from podguard.state import subdir

    base = resolve_state(opts.state_dir)
    key = oc.job_key(cfg.argv or [str(cfg.job_file)], cfg.mode, extra=[os.environ.get("GPU_LIST", "")])
    decision = oc.plan_launch(key, rerun=cfg.rerun, state=base)
    if decision.action == "skip":
        _say(f"podguard: {decision.reason}")
        return _after(cfg, 0, decision.record)
    if decision.action == "backoff":
        got = oc.backoff_wait(decision, out=sys.stderr)
        if got is not None:
            return 128 + got

    opts = replace(
        opts,
        lease=True,
        wait_for_gpus=wait_for_gpus,
        extra={**opts.extra, "command_line": "podguard " + opts.command + " -- " + shlex.join(cfg.argv)},
    )
    pre = run_preflight(opts, validate_selection=_check_against_selection(cfg))
    if pre.exit_code != 0:
        return _after(cfg, pre.exit_code, None)
    assert pre.selection is not None
    port_lease = None
    started = time.time()
    try:
        selection = pre.selection
        run_dir = subdir(subdir(base, "runs"), time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}")
        env: dict[str, str] = {"PODGUARD_RUN_DIR": str(run_dir), "PODGUARD_STATE_DIR": str(base)}
        mode = cfg.mode
        if mode == "auto":
            from podguard.launch.modes import pick_mode

            choice = pick_mode(cfg.argv, selection)
            mode = choice.mode
            _say(f"podguard: {choice.reason}")
        port = cfg.master_port
        if mode in ("per-gpu", "roles") or (mode == "torchrun" and port is not None and not cfg.multi_node):
            from podguard.preflight.leases import allocate_master_port

            port_lease = allocate_master_port(port, command=opts.extra.get("command_line"))
            port = port_lease.port
        if cfg.prepare_argv is not None:
            env.update(_prepare(cfg, base, env))
        outcome = _run_mode(mode, cfg, selection, env, port, run_dir)
        record = oc.record_outcome(
            outcome, key=key, argv=cfg.argv or [str(cfg.job_file)], mode=mode, started_at=started, state=base
        )
        code = outcome.exit_code
        _say(f"podguard: logs: {run_dir}")
    finally:
        if port_lease is not None:
            port_lease.release()
        if pre.lease is not None:
            pre.lease.release()
    return _after(cfg, code, record)


def _run_mode(
    mode: str, cfg: LaunchConfig, selection: Selection, env: dict[str, str], port: int | None, run_dir: Path
) -> JobOutcome:
    from podguard.launch import modes
    from podguard.launch.supervisor import run_job

    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    only: set[str] | None = None
    if mode == "roles":
        assert cfg.job_file is not None and port is not None
        plan = modes.load_roles(cfg.job_file, selection, master_port=port, log_dir=logs)
        specs = plan.specs()
        if cfg.only_gpu is not None:
            only = modes.only_for_gpu(specs, cfg.only_gpu)
        return modes.run_roles(plan, selection, master_port=port, log_dir=logs, grace_s=cfg.grace, only=only)
    if mode == "torchrun":
        from podguard.launch.torchrun.command import build_torchrun_spec, explain_torchrun_failure

        errors = run_dir / "torchrun"
        spec = build_torchrun_spec(
            cfg.argv,
            selection,
            nnodes=cfg.nnodes,
            node_rank=cfg.node_rank,
            master_addr=cfg.master_addr,
            master_port=port,
            max_restarts=cfg.max_restarts,
            error_dir=errors,
            log_dir=logs,
            extra_env=env,
            nproc=cfg.cpu_workers,
            only_local_ranks=None if cfg.only_gpu is None else _local_rank_of(selection, cfg.only_gpu),
            shutdown_timeout_s=max(cfg.grace - 1.0, 1.0),
        )
        from podguard.launch.supervisor import format_summary

        outcome = explain_torchrun_failure(run_job([spec], grace_s=cfg.grace, summary=False), errors)
        _say(format_summary(outcome))
        return outcome
    if mode == "single":
        specs = [modes.single_spec(cfg.argv, selection, log_dir=logs, env=env)]
    else:
        assert port is not None
        specs = modes.per_gpu_specs(
            cfg.argv,
            selection,
            master_port=port,
            master_addr=cfg.master_addr or "127.0.0.1",
            prefix_format=cfg.prefix,
            log_dir=logs,
            nproc=cfg.cpu_workers,
            env=env,
        )
        if cfg.only_gpu is not None:
            only = modes.only_for_gpu(specs, cfg.only_gpu)
    return run_job(specs, grace_s=cfg.grace, only=only)


def _local_rank_of(selection: Selection, gpu: str) -> list[int]:
    idx = int(gpu)
    ranks = [pos for pos, g in enumerate(selection.gpus) if g.index == idx]
    if selection.gpus and not ranks:
        raise UsageError(f"--only-gpu={gpu}: GPU {gpu} is not selected; selected: {list(selection.indices)}")
    return ranks or [idx]


def _prepare(cfg: LaunchConfig, base: Path, env: dict[str, str]) -> dict[str, str]:
    from podguard.launch.prepare import prepare_once

    assert cfg.prepare_argv is not None
    result = prepare_once(
        cfg.prepare_argv,
        cache_root=base / "prepare",
        key_parts=cfg.cache_key,
        env={**os.environ, **env},
        shared_storage=cfg.prepare_shared,
        node_rank=cfg.node_rank,
    )
    return {"PODGUARD_PREPARE_DIR": str(result.path)}


def _after(cfg: LaunchConfig, code: int, record: Path | None) -> int:
    if cfg.on_exit == "idle":
        from podguard.launch.lifecycle import idle

        return idle(code, record, out=sys.stderr)
    return code


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


COMMANDS = {"train": train, "run": run, "sweep": sweep}

"""torchrun mode: the `python -m torch.distributed.run` agent command for the user's training command.

    spec = build_torchrun_spec(["python", "train.py"], selection, error_dir=run_dir / "torchrun", log_dir=logs)
    outcome = explain_torchrun_failure(run_job([spec]), run_dir / "torchrun")   # failure.py

podguard supervises the agent as one worker. By default every rank runs under podguard's rank wrapper
(`python -m podguard.rank.wrap`), which prefixes its lines `rank{N}:` and records its real exit status.
What torch 2.13 does with each argument, and why these choices: docs/torchrun.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.errors import UsageError
from podguard.launch.job_env import line_buffering_env, progress_bar_env
from podguard.launch.ports import parse_int
from podguard.launch.prefix import RANK_PREFIX_FIELDS, check_format
from podguard.launch.spec import WorkerSpec
from podguard.launch.torchrun.rendezvous import RdzvBackend, env_value, rendezvous_args, resolve_rendezvous
from podguard.rank.wrap import DEFAULT_RANK_PREFIX, WRAP_MODULE

if TYPE_CHECKING:
    from podguard.gpu.selected import Selection

__all__ = [
    "AGENT_NAME",
    "DEFAULT_CPU_NPROC",
    "REPLY_FILE",
    "CommandKind",
    "UserCommand",
    "build_torchrun_spec",
    "classify_command",
]

AGENT_NAME = "torchrun"
REPLY_FILE = "torchrun_error.json"  # the agent's TORCHELASTIC_ERROR_FILE, inside error_dir
DEFAULT_CPU_NPROC = 2

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
# Commands that start ranks themselves: under torchrun each rank would start a whole job (N x M processes).
_LAUNCHERS = {
    "torchrun": "torchrun",
    "accelerate": "accelerate launch",
    "accelerate-launch": "accelerate launch",
    "deepspeed": "deepspeed",
    "deepspeed.pt": "deepspeed",
    "lightning": "lightning's CLI",
    "fabric": "Lightning Fabric's CLI",
    "mpirun": "mpirun",
    "mpiexec": "mpiexec",
    "srun": "srun",
    "colossalai": "colossalai run",
    "composer": "composer",
}
_LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torch.distributed.launch",
    "accelerate.commands.launch": "accelerate launch",
    "accelerate.commands.accelerate_cli": "accelerate launch",
    "deepspeed.launcher.runner": "deepspeed",
    "lightning": "lightning's CLI",
    "lightning.fabric.cli": "Lightning Fabric's CLI",
    "lightning_fabric.cli": "Lightning Fabric's CLI",
    "composer.cli.launcher": "composer",
}


class CommandKind(StrEnum):
    SCRIPT = "script"  # `python x.py args` / `x.py args`
    MODULE = "module"  # `python -m pkg args`
    PROGRAM = "program"  # anything else (a shell script, a binary, `python -c`): torchrun --no-python


@dataclass(frozen=True)
class UserCommand:
    """The user's argv, classified the way torchrun can start it."""

    kind: CommandKind
    python: str | None  # the interpreter the user named (resolved on PATH); None = not named
    python_opts: tuple[str, ...]  # interpreter options before the script, e.g. ("-O",), "-u" dropped
    target: str  # script path, module name, or program
    args: tuple[str, ...]

    def worker_argv(self, python: str) -> list[str]:
        """The argv that runs one worker directly (what the rank wrapper starts)."""
        if self.kind is CommandKind.SCRIPT:
            return [python, "-u", *self.python_opts, self.target, *self.args]
        if self.kind is CommandKind.MODULE:
            return [python, "-u", *self.python_opts, "-m", self.target, *self.args]
        return [self.target, *self.args]

    def torchrun_tail(self) -> list[str]:
        """The part of torchrun's argv after its own options, without the rank wrapper.

        torchrun adds `python -u` itself for scripts and modules; interpreter options other than -u
        cannot be passed that way, so such commands go through --no-python with the full argv.
        """
        if self.kind is CommandKind.SCRIPT and not self.python_opts:
            return [self.target, *self.args]
        if self.kind is CommandKind.MODULE and not self.python_opts:
            return ["-m", self.target, *self.args]
        if self.kind is CommandKind.PROGRAM:
            return ["--no-python", self.target, *self.args]
        return ["--no-python", *self.worker_argv(self.python or sys.executable)]


def _is_python(token: str) -> bool:
    return bool(_PYTHON_RE.match(os.path.basename(token))) or token == sys.executable


def _launcher_refused(what: str, argv: Sequence[str]) -> UsageError:
    command = shlex.join(argv)
    command = command if len(command) <= 80 else command[:77] + "..."
    return UsageError(
        f"the command is a launcher ({what}): in torchrun mode every rank would start it, and each would start its "
        f"own ranks; run the launcher in single mode (`podguard train --mode single -- {command}`), "
        "or give torchrun mode the training script itself (`podguard train --mode torchrun -- python train.py`)"
    )


_WRAPPERS = {"env", "nohup", "nice", "ionice", "taskset", "numactl", "stdbuf", "time"}  # run the next word
_RUNNERS = {"uv", "poetry", "pipenv", "pdm", "hatch", "conda", "micromamba"}  # `<runner> run [opts] CMD`


def _unwrapped(argv: Sequence[str]) -> Sequence[str]:
    """The command behind wrappers that run another command (`env X=1 …`, `nice -n 5 …`, `uv run …`), so that a
    launcher behind them is still seen. Options are skipped by their dash; an option's own value (`nice -n 5`) is
    skipped too when it is not a command name that could be the launcher."""
    i = 0
    while i < len(argv):
        name = os.path.basename(argv[i])
        if name in _RUNNERS and i + 1 < len(argv) and argv[i + 1] == "run":
            i += 2
        elif name in _WRAPPERS:
            i += 1
        else:
            return argv[i:]
        while i < len(argv) and (argv[i].startswith("-") or "=" in argv[i] or argv[i].isdigit()):
            i += 1
    return argv[i:]


def _refuse_launcher(argv: Sequence[str]) -> None:
    if not argv or not argv[0]:
        raise UsageError("torchrun mode needs a command, e.g. `podguard train -- python train.py`")
    inner = _unwrapped(argv)
    what = _LAUNCHERS.get(os.path.basename(inner[0])) if inner else None
    if what is not None:
        raise _launcher_refused(what, argv)


def _python_command(python: str, argv: Sequence[str]) -> UserCommand:
    """`python [opts] x.py args`, `python [opts] -m pkg args`, or anything else run as a program."""
    opts: list[str] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "-m":
            if i + 1 >= len(argv):
                raise UsageError("`python -m` needs a module name, e.g. `python -m mypkg.train`")
            module = argv[i + 1]
            if module in _LAUNCHER_MODULES:
                raise _launcher_refused(f"python -m {module}", argv)
            return UserCommand(CommandKind.MODULE, python, tuple(opts), module, tuple(argv[i + 2 :]))
        if tok in ("-c", "-") or not tok.startswith("-"):
            break
        if tok in ("-X", "-W", "--check-hash-based-pycs") and i + 1 < len(argv):
            opts.extend(argv[i : i + 2])
            i += 1
        elif tok != "-u":  # -u is always added
            opts.append(tok)
        i += 1
    if i < len(argv) and not argv[i].startswith("-"):
        what = _LAUNCHERS.get(os.path.basename(argv[i]))  # `python /venv/bin/accelerate launch ...`
        if what is not None:
            raise _launcher_refused(what, argv)
        return UserCommand(CommandKind.SCRIPT, python, tuple(opts), argv[i], tuple(argv[i + 1 :]))
    # `python -c CODE`, `python -` or a bare interpreter: run exactly as given
    return UserCommand(CommandKind.PROGRAM, python, (), python, tuple(argv[1:]))


def classify_command(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> UserCommand:
    """Classify the user's argv (see `UserCommand`); refuse a command that is itself torchrun.

    `python` is resolved on the job's PATH so that the interpreter the user named runs both the agent
    and the workers (it is the one that has their torch), not necessarily podguard's own.
    """
    _refuse_launcher(argv)
    env = os.environ if environ is None else environ
    first = argv[0]
    if not _is_python(first):
        kind = CommandKind.SCRIPT if first.endswith(".py") else CommandKind.PROGRAM
        return UserCommand(kind, None, (), first, tuple(argv[1:]))
    python = first if os.sep in first else shutil.which(first, path=env.get("PATH"))
    if python is None:
        raise UsageError(f"{first!r} is not on PATH; name the interpreter by its full path")
    return _python_command(python, argv)


# --------------------------------------------------------------------------------------------------
# The agent's WorkerSpec


def _cpu_nproc(nproc: int | None, environ: Mapping[str, str]) -> int:
    if nproc is not None:
        if nproc < 1:
            raise UsageError(f"nproc={nproc} is invalid; expected the number of CPU workers, an integer >= 1")
        return nproc
    raw = env_value(environ, "NUM_TRAINERS")
    if raw is None:
        return DEFAULT_CPU_NPROC
    value = parse_int(raw, "NUM_TRAINERS", "expected the number of workers per node, an integer >= 1")
    if value < 1:
        raise UsageError(f"NUM_TRAINERS={value} is invalid; expected an integer >= 1")
    return value


def _check_agent_python(agent_python: str) -> None:
    if agent_python == sys.executable and importlib.util.find_spec("torch") is None:
        raise UsageError(
            f"torchrun mode needs PyTorch in {sys.executable} (pip install torch), "
            "or name the interpreter that has it: `-- /path/to/python train.py`"
        )


def torchrun_accepts(agent_python: str, option: str) -> bool:
    """Whether the torchrun of `agent_python`'s torch takes `option`, read from its source, torch not imported.

    Older torch releases lack options newer ones have (`--shutdown-timeout` is not in torch 2.11's torchrun:
    seen on a real H200 pod, where passing it made torchrun exit 2 before any worker started). An option
    that cannot be confirmed is left out: torchrun's own default applies, and podguard's grace still bounds it.
    """
    torch_dir = _torch_dir(agent_python)
    if torch_dir is None:
        return False
    try:
        source = (torch_dir / "distributed" / "run.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return f'"{option}"' in source


def _torch_dir(agent_python: str) -> Path | None:
    """Where `agent_python` finds torch (find_spec of the top-level package imports nothing)."""
    if agent_python == sys.executable:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        return Path(locations[0]) if locations else None
    code = "import importlib.util as u; s = u.find_spec('torch'); print(list(s.submodule_search_locations)[0])"
    try:
        out = subprocess.run([agent_python, "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _prepare_dirs(error_dir: Path, log_dir: Path | None) -> Path:
    """Create the folders; remove a stale reply file (it must not explain this run). The reply file path."""
    error_dir.mkdir(parents=True, exist_ok=True)
    reply = error_dir / REPLY_FILE
    with contextlib.suppress(FileNotFoundError):
        reply.unlink()
    if log_dir is not None:
        with contextlib.suppress(OSError):  # per-rank logs are best-effort (a full volume): the job still runs
            Path(log_dir).mkdir(parents=True, exist_ok=True)
    return reply


def _wrapped_tail(
    cmd: UserCommand, agent_python: str, selection: Selection, rank_prefix: str, log_dir: Path | None,
    only_local_ranks: Collection[int] | None,
) -> list[str]:  # fmt: skip
    """Every rank through podguard's rank wrapper: `--no-python python -mpodguard.rank.wrap LABEL ... -- CMD`.

    `-mMODULE` and `--opt=value` start with "-", so torch names the job after the first other argument,
    the label: "train.py FAILED" as with plain torchrun, not "podguard.rank.wrap".
    """
    wrap = [sys.executable, f"-m{WRAP_MODULE}", cmd.target, f"--prefix={rank_prefix}", "--activity=1"]
    if log_dir is not None:
        wrap.append(f"--log-dir={log_dir}")
    if not selection.cpu_only:
        wrap.append("--gpus=" + ",".join(str(i) for i in selection.indices))
    if only_local_ranks is not None:
        wrap.append("--show=" + (",".join(str(r) for r in sorted(only_local_ranks)) or "none"))
    return ["--no-python", *wrap, "--", *cmd.worker_argv(agent_python)]


def _plain_tail(cmd: UserCommand, only_local_ranks: Collection[int] | None) -> list[str]:
    """Plain torchrun: workers share the agent's output (no prefix, no per-rank log)."""
    if only_local_ranks:  # without tee/redirects torch sends the other ranks' output to /dev/null
        return ["--local-ranks-filter", ",".join(str(r) for r in sorted(only_local_ranks)), *cmd.torchrun_tail()]
    return cmd.torchrun_tail()


def _agent_env(
    selection: Selection, reply: Path, workers: int, env_in: Mapping[str, str], extra_env: Mapping[str, str] | None
) -> dict[str, str]:
    env: dict[str, str] = dict(selection.child_env())
    env["TORCHELASTIC_ERROR_FILE"] = str(reply)
    env["PYTHONUNBUFFERED"] = "1"  # the agent's own log lines arrive in order with the workers'
    env.update(line_buffering_env(env_in))  # native ranks (--no-python programs) print line by line too
    env.update(progress_bar_env(env_in))  # rich's live displays (Lightning's default bar) draw on a pipe
    if workers > 1 and "OMP_NUM_THREADS" not in env_in:
        env["OMP_NUM_THREADS"] = "1"  # what torchrun would set anyway, without its 5-line banner
    env.update(extra_env or {})
    return env


def build_torchrun_spec(
    user_argv: Sequence[str],
    selection: Selection,
    *,
    nnodes: int | str | None = None,
    node_rank: int | str | None = None,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    rdzv_id: str | None = None,
    max_restarts: int = 0,
    error_dir: Path,
    log_dir: Path | None,
    extra_env: Mapping[str, str] | None = None,
    nproc: int | None = None,
    environ: Mapping[str, str] | None = None,
    prefix_ranks: bool = True,
    rank_prefix: str = DEFAULT_RANK_PREFIX,
    only_local_ranks: Collection[int] | None = None,
    shutdown_timeout_s: float | None = None,
    rdzv_backend: RdzvBackend | str = RdzvBackend.AUTO,
) -> WorkerSpec:
    """The WorkerSpec that runs `python -m torch.distributed.run` for `user_argv` on this node.

    `--nproc-per-node` is the number of selected GPUs (seen by UUID), or on a CPU-only node `nproc`
    workers (else NUM_TRAINERS, else 2) on gloo. Rendezvous: `rendezvous.py`. `error_dir` is torchrun's
    `--log-dir` (torch's error files, the wrapper's exit records, the agent's reply file): a fresh folder
    per run. `log_dir` receives `torchrun.log` and, with `prefix_ranks`, `rank{N}.log` per rank.
    `shutdown_timeout_s`: torchrun's own SIGTERM-to-SIGKILL grace; keep it below podguard's.
    Bad values raise UsageError (exit 64) naming the value and what is valid; docs/torchrun.md.
    """
    env_in = os.environ if environ is None else environ
    cmd = classify_command(user_argv, env_in)
    rdzv = resolve_rendezvous(
        env_in, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port,
        rdzv_id=rdzv_id,
    )  # fmt: skip
    rdzv_argv = rendezvous_args(rdzv, rdzv_backend)
    if max_restarts < 0:
        raise UsageError(f"max_restarts={max_restarts} is invalid; expected an integer >= 0")
    if shutdown_timeout_s is not None and shutdown_timeout_s < 0:
        raise UsageError(f"shutdown timeout {shutdown_timeout_s} is invalid; expected seconds >= 0")
    workers = len(selection.gpus) if not selection.cpu_only else _cpu_nproc(nproc, env_in)
    if prefix_ranks:
        check_format(rank_prefix, RANK_PREFIX_FIELDS, "rank prefix")
    agent_python = cmd.python or sys.executable
    _check_agent_python(agent_python)
    reply = _prepare_dirs(Path(error_dir), log_dir)

    argv = [agent_python, "-m", "torch.distributed.run", "--nproc-per-node", str(workers), *rdzv_argv]
    argv += ["--max-restarts", str(max_restarts), "--log-dir", str(error_dir)]
    if shutdown_timeout_s is not None and torchrun_accepts(agent_python, "--shutdown-timeout"):
        argv += ["--shutdown-timeout", str(max(int(shutdown_timeout_s), 0))]  # torchrun takes whole seconds
    if prefix_ranks:
        argv += _wrapped_tail(cmd, agent_python, selection, rank_prefix, log_dir, only_local_ranks)
    else:
        argv += _plain_tail(cmd, only_local_ranks)
    return WorkerSpec(
        name=AGENT_NAME,
        argv=tuple(argv),
        env=_agent_env(selection, reply, workers, env_in, extra_env),
        prefix="",  # workers' lines carry their rank prefix already; the agent's own lines stay plain
        log_path=Path(log_dir) / "torchrun.log" if log_dir is not None else None,
    )

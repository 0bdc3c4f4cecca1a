"""torchrun mode: build the `torch.distributed.run` agent command, and explain how its job ended.

Why torchrun and not a home-made launcher: torch's elastic agent owns rendezvous (c10d, multi-node),
restarts and the RANK/WORLD_SIZE contract that training scripts expect. podguard supervises the agent
as one `WorkerSpec`; this module decides the agent's arguments and, afterwards, turns torchrun's
"exit 1 for every failure" into the failing rank and its real exit code.

Facts pinned down in torch 2.13's source (`torch/distributed/run.py`, `elastic/multiprocessing/api.py`,
`elastic/multiprocessing/errors/__init__.py` and `error_handler.py`):

* `--log-dir DIR` makes `DefaultLogsSpecs` give every worker `TORCHELASTIC_ERROR_FILE=
  DIR/<rdzv_id>_<random>/attempt_<restart>/<local_rank>/error.json` (the directory is created even when
  nothing is redirected). Without `--log-dir` it is the same layout under a fresh `/tmp/torchelastic_*`,
  which nobody can find afterwards, so podguard always passes `--log-dir`.
* A worker writes that file only if its entry point is wrapped in `@record`, and only for an uncaught
  exception: `{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": ..., "timestamp":
  "<epoch s>"}}}`. It holds no exit code and no rank (the local rank is the directory name).
* The agent's own `main` is `@record` too: on `ChildFailedError` it copies the root-cause worker's
  error.json to the agent's `TORCHELASTIC_ERROR_FILE` (the "reply file") with `message.errorCode` set to
  the worker's exit code; it writes nothing there when that worker had no error file. For an agent-side
  exception (rendezvous timeout ...) it records that exception instead, with no `errorCode`.
* The agent then dies with Python's exit status 1 and prints the `ChildFailedError` summary on stderr:
  a "Root Cause (first observed failure)" block with `rank      : 1 (local_rank: 1)` and
  `exitcode  : 3 (pid: 1234)` (negative = killed by that signal). That text is the only source of the
  code when no worker used `@record`.
* Without `--tee`/`--redirects`, workers inherit the agent's stdout/stderr: one shared pipe, no per-rank
  prefix. `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE` (there is no `--log-line-prefix-template` flag in 2.13)
  only applies to *tee'd* streams, which torch tails from files with a 0.1 s poll and `readline()`:
  a line written in two pieces is printed as two prefixed fragments.

Output decision: by default each worker is started through a tiny podguard wrapper (`python
-mpodguard.launch.torchrun.command ...`, no torch import) that reads the worker's own pipes and writes
whole lines, prefixed `rank{N}:`, to the shared pipe in single `write()`s of at most PIPE_BUF bytes (so
ranks never interleave mid-line), keeps per-rank log files, and records the worker's real exit status,
rank and last lines in `podguard_exit.json` next to torch's error.json. The wrapper shares the worker's
process group, so torchrun's `killpg` reaches the worker directly; the wrapper then ends the same way
the worker did (same code, or the same signal), so torch's own bookkeeping is unchanged.
`prefix_ranks=False` gives the plain torchrun behaviour (script / `-m` / `--no-python` forms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from podguard.errors import UsageError, signal_exit_code
from podguard.launch.spec import JobOutcome, WorkerExit, WorkerSpec
from podguard.preflight.selection import Selection

AGENT_NAME = "torchrun"
REPLY_FILE = "torchrun_error.json"  # the agent's TORCHELASTIC_ERROR_FILE, inside error_dir
EXIT_FILE = "podguard_exit.json"  # written by the rank wrapper next to torch's per-worker error.json
DEFAULT_CPU_NPROC = 2
DEFAULT_MULTINODE_PORT = 29500  # torch's default; every node computes the same value
DEFAULT_RDZV_ID = "podguard"  # must be identical on every node, so it cannot be random
DEFAULT_RANK_PREFIX = "rank{rank}:"
PIPE_BUF = 4096  # POSIX guarantees writes up to this size to a pipe are atomic (Linux: 4096)
TAIL_LINES = 20

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
_LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_PREFIX_FIELDS = ("rank", "local_rank", "node_rank", "gpu")


# --------------------------------------------------------------------------------------------------
# The user's command


@dataclass(frozen=True)
class UserCommand:
    """The user's argv, classified the way torchrun can start it.

    kind: "script" (`python x.py args` / `x.py args`), "module" (`python -m pkg args`) or "program"
    (anything else: a shell script, a binary, `python -c ...`, which torchrun runs with --no-python).
    """

    kind: str
    python: str | None  # the interpreter the user named (resolved on PATH); None = not named
    python_opts: tuple[str, ...]  # interpreter options before the script, e.g. ("-O",), "-u" dropped
    target: str  # script path, module name, or program
    args: tuple[str, ...]

    def worker_argv(self, python: str) -> list[str]:
        """The argv that runs one worker directly (what the rank wrapper starts)."""
        if self.kind == "script":
            return [python, "-u", *self.python_opts, self.target, *self.args]
        if self.kind == "module":
            return [python, "-u", *self.python_opts, "-m", self.target, *self.args]
        return [self.target, *self.args]

    def torchrun_tail(self) -> list[str]:
        """The part of torchrun's argv after its own options, without the rank wrapper.

        torchrun adds `python -u` itself for scripts and modules; interpreter options other than -u
        cannot be passed that way, so such commands go through --no-python with the full argv.
        """
        if self.kind == "script" and not self.python_opts:
            return [self.target, *self.args]
        if self.kind == "module" and not self.python_opts:
            return ["-m", self.target, *self.args]
        if self.kind == "program":
            return ["--no-python", self.target, *self.args]
        python = self.python or sys.executable
        return ["--no-python", *self.worker_argv(python)]


def _is_python(token: str) -> bool:
    return bool(_PYTHON_RE.match(os.path.basename(token))) or token == sys.executable


def classify_command(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> UserCommand:
    """Classify the user's argv (see `UserCommand`); refuse a command that is itself torchrun.

    `python` is resolved on the job's PATH so that the interpreter the user named runs both the agent
    and the workers (it is the one that has their torch), not necessarily podguard's own.
    """
    if not argv or not argv[0]:
        raise UsageError("torchrun mode needs a command, e.g. `podguard train -- python train.py`")
    env = os.environ if environ is None else environ
    first = argv[0]
    if os.path.basename(first) == "torchrun":
        raise UsageError(
            "the command already starts torchrun; give the training script itself "
            "(`podguard train -- python train.py`), or use --mode single to run it as is"
        )
    if not _is_python(first):
        if first.endswith(".py"):
            return UserCommand("script", None, (), first, tuple(argv[1:]))
        return UserCommand("program", None, (), first, tuple(argv[1:]))

    python = first if os.sep in first else shutil.which(first, path=env.get("PATH"))
    if python is None:
        raise UsageError(f"{first!r} is not on PATH; name the interpreter by its full path")
    opts: list[str] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "-m":
            if i + 1 >= len(argv):
                raise UsageError("`python -m` needs a module name, e.g. `python -m mypkg.train`")
            module = argv[i + 1]
            if module in _LAUNCHER_MODULES:
                raise UsageError(
                    f"the command already starts {module}; give the training script itself, "
                    "or use --mode single to run it as is"
                )
            return UserCommand("module", python, tuple(opts), module, tuple(argv[i + 2 :]))
        if tok in ("-c", "-") or not tok.startswith("-"):
            break
        if tok == "-u":
            pass  # always added
        elif tok in ("-X", "-W", "--check-hash-based-pycs") and i + 1 < len(argv):
            opts.extend(argv[i : i + 2])
            i += 1
        else:
            opts.append(tok)
        i += 1
    if i < len(argv) and not argv[i].startswith("-"):
        return UserCommand("script", python, tuple(opts), argv[i], tuple(argv[i + 1 :]))
    # `python -c CODE`, `python -` or a bare interpreter: run exactly as given
    return UserCommand("program", python, (), python, tuple(argv[1:]))


# --------------------------------------------------------------------------------------------------
# Validation helpers


def _parse_int(raw: str | int, name: str, valid: str) -> int:
    if isinstance(raw, bool):
        raise UsageError(f"{name}={raw!r} is not a whole number; {valid}")
    if isinstance(raw, int):
        return raw
    text = raw.strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise UsageError(f"{name}={raw!r} is not a whole number; {valid}")
    return int(text)


def parse_port(raw: str | int, name: str = "MASTER_PORT") -> int:
    """A TCP port from user input: a whole number in 1..65535, else a usage error naming `name`."""
    port = _parse_int(raw, name, "expected a TCP port in 1..65535")
    if not 1 <= port <= 65535:
        raise UsageError(f"{name}={port} is out of range; expected a TCP port in 1..65535")
    return port


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value if value not in (None, "") else None


@dataclass(frozen=True)
class Rendezvous:
    """Where this node's agent meets the others: the resolved multi-node settings."""

    nnodes: int
    node_rank: int | None  # None when unknown (single node, or c10d decides)
    addr: str | None  # rendezvous host; None = standalone
    port: int | None
    local_addr: str | None  # this node's address on the cluster network (RunPod NODE_ADDR)
    rdzv_id: str


def resolve_rendezvous(
    environ: Mapping[str, str],
    *,
    nnodes: int | str | None = None,
    node_rank: int | str | None = None,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    rdzv_id: str | None = None,
) -> Rendezvous:
    """Resolve node count, node rank, primary address/port from flags, then RunPod's Instant Cluster
    variables, then the classic MASTER_* names (RunPod sets both spellings to the same values).

    RunPod's meaning (docs.runpod.io/instant-clusters/configuration): PRIMARY_ADDR / MASTER_ADDR = the
    primary node's address, PRIMARY_PORT / MASTER_PORT = its port, NODE_RANK = this node's rank (0 on
    the primary), NUM_NODES = node count, NUM_TRAINERS = GPUs per node, NODE_ADDR = this node's static IP
    on the cluster network, WORLD_SIZE = NUM_NODES * NUM_TRAINERS.
    """
    raw_nnodes: str | int | None = nnodes if nnodes is not None else _env(environ, "NUM_NODES")
    name_nnodes = "--nnodes" if nnodes is not None else "NUM_NODES"
    n = 1
    if raw_nnodes is not None:
        n = _parse_int(raw_nnodes, name_nnodes, "expected the number of nodes, an integer >= 1")
        if n < 1:
            raise UsageError(f"{name_nnodes}={n} is invalid; expected the number of nodes, an integer >= 1")

    raw_rank: str | int | None = node_rank if node_rank is not None else _env(environ, "NODE_RANK")
    name_rank = "--node-rank" if node_rank is not None else "NODE_RANK"
    rank: int | None = None
    if raw_rank is not None:
        rank = _parse_int(raw_rank, name_rank, f"expected this node's rank in [0, {n})")
        if not 0 <= rank < n:
            raise UsageError(
                f"{name_rank}={rank} is out of range; expected this node's rank in [0, {n}) "
                f"for {n} node{'s' if n != 1 else ''}"
            )

    port: int | None = None
    if master_port is not None:
        port = parse_port(master_port, "--master-port")
    elif n > 1:
        for var in ("PRIMARY_PORT", "MASTER_PORT"):
            raw = _env(environ, var)
            if raw is not None:
                port = parse_port(raw, var)
                break
        if port is None:
            port = DEFAULT_MULTINODE_PORT

    addr = master_addr or None
    local_addr = None
    if n > 1:
        addr = addr or _env(environ, "PRIMARY_ADDR") or _env(environ, "MASTER_ADDR")
        if addr is None:
            raise UsageError(
                f"{name_nnodes}={n} needs the primary node's address: set PRIMARY_ADDR "
                "(RunPod Instant Clusters set it) or MASTER_ADDR, or pass --master-addr"
            )
        local_addr = _env(environ, "NODE_ADDR")
    elif port is not None:
        addr = addr or "127.0.0.1"
    if rdzv_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", rdzv_id):
        raise UsageError(f"--rdzv-id={rdzv_id!r} is invalid; use letters, digits, '.', '_' or '-'")
    return Rendezvous(n, rank, addr, port, local_addr, rdzv_id or DEFAULT_RDZV_ID)


# --------------------------------------------------------------------------------------------------
# Building the agent's WorkerSpec


def _cpu_nproc(nproc: int | None, environ: Mapping[str, str]) -> int:
    if nproc is not None:
        if nproc < 1:
            raise UsageError(f"nproc={nproc} is invalid; expected the number of CPU workers, an integer >= 1")
        return nproc
    raw = _env(environ, "NUM_TRAINERS")
    if raw is not None:
        value = _parse_int(raw, "NUM_TRAINERS", "expected the number of workers per node, an integer >= 1")
        if value < 1:
            raise UsageError(f"NUM_TRAINERS={value} is invalid; expected an integer >= 1")
        return value
    return DEFAULT_CPU_NPROC


def _check_prefix_template(template: str) -> None:
    try:
        template.format(**dict.fromkeys(_PREFIX_FIELDS, 0))
    except (KeyError, IndexError, ValueError) as exc:
        fields = ", ".join("{" + f + "}" for f in _PREFIX_FIELDS)
        raise UsageError(f"rank prefix {template!r} is invalid ({exc}); it may use {fields}") from None


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
    rdzv_backend: str = "c10d",
) -> WorkerSpec:
    """The WorkerSpec that runs `python -m torch.distributed.run` for `user_argv` on this node.

    * `--nproc-per-node` = the number of selected GPUs, which the agent sees by UUID
      (`selection.child_env()`); on a CPU-only node `nproc` workers (else NUM_TRAINERS, else 2) use gloo.
    * One node: `--standalone` (c10d on a kernel-chosen port; the workers' MASTER_PORT is another
      kernel-chosen port, so concurrent runs cannot collide). With an explicit `master_port` (the user's
      MASTER_PORT, or a leased one): static rendezvous on 127.0.0.1:PORT, the classic torchrun behaviour
      where the workers' MASTER_PORT is exactly that port.
    * Several nodes (flags first, then NUM_NODES / NODE_RANK / PRIMARY_ADDR / PRIMARY_PORT):
      `--rdzv-backend c10d --rdzv-endpoint ADDR:PORT --nnodes N`, `--rdzv-conf is_host=` true on node 0
      only (torch's guess compares the address to this machine's hostname and misses secondary NICs,
      which is where RunPod's cluster network lives), `--local-addr NODE_ADDR` when set. `--node-rank`
      is not passed: with c10d torch ignores it (and warns). c10d assigns node (group) ranks by sorting
      the nodes' addresses as strings, so global rank 0 is not necessarily on NODE_RANK 0;
      `rdzv_backend="static"` (`--master-addr/--master-port/--node-rank`, RunPod's own example) makes
      node n hold ranks n*k..n*k+k-1, at the cost of elasticity.
    * `error_dir` is torchrun's `--log-dir` (torch's per-worker error.json, podguard's exit records) and
      holds the agent's reply file; use a fresh directory per run. `log_dir` (optional) receives
      `torchrun.log` (everything, rank-prefixed) and, with `prefix_ranks`, `rank{N}.log` per worker.
    * `shutdown_timeout_s`: torchrun's grace between SIGTERM and SIGKILL for its workers (torch's default
      is 30 s); keep it below podguard's own grace so torchrun, not podguard, escalates.
    Bad values raise `UsageError` (exit 64) naming the value and what is valid.
    """
    env_in = os.environ if environ is None else environ
    cmd = classify_command(user_argv, env_in)
    rdzv = resolve_rendezvous(
        env_in, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port,
        rdzv_id=rdzv_id,
    )  # fmt: skip
    if rdzv_backend not in ("c10d", "static"):
        raise UsageError(f"rendezvous backend {rdzv_backend!r} is not supported; expected 'c10d' or 'static'")
    if max_restarts < 0:
        raise UsageError(f"max_restarts={max_restarts} is invalid; expected an integer >= 0")
    if shutdown_timeout_s is not None and shutdown_timeout_s < 0:
        raise UsageError(f"shutdown timeout {shutdown_timeout_s} is invalid; expected seconds >= 0")
    workers = len(selection.gpus) if not selection.cpu_only else _cpu_nproc(nproc, env_in)
    if prefix_ranks:
        _check_prefix_template(rank_prefix)

    agent_python = cmd.python or sys.executable
    if agent_python == sys.executable and importlib.util.find_spec("torch") is None:
        raise UsageError(
            f"torchrun mode needs PyTorch in {sys.executable} (pip install torch), "
            "or name the interpreter that has it: `-- /path/to/python train.py`"
        )

    error_dir = Path(error_dir)
    error_dir.mkdir(parents=True, exist_ok=True)
    reply = error_dir / REPLY_FILE
    with contextlib.suppress(FileNotFoundError):
        reply.unlink()  # a stale reply file from an earlier run must not explain this one
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)

    argv: list[str] = [agent_python, "-m", "torch.distributed.run", "--nproc-per-node", str(workers)]
    if rdzv.nnodes > 1 and rdzv_backend == "static":
        assert rdzv.addr is not None and rdzv.port is not None
        if rdzv.node_rank is None:
            raise UsageError(
                f"static rendezvous over {rdzv.nnodes} nodes needs NODE_RANK (or --node-rank) "
                f"in [0, {rdzv.nnodes}) on every node"
            )
        argv += ["--nnodes", str(rdzv.nnodes), "--rdzv-backend", "static", "--node-rank", str(rdzv.node_rank)]
        argv += ["--master-addr", rdzv.addr, "--master-port", str(rdzv.port)]
        if rdzv.local_addr:
            argv += ["--local-addr", rdzv.local_addr]
    elif rdzv.nnodes > 1:
        assert rdzv.addr is not None and rdzv.port is not None
        argv += ["--nnodes", str(rdzv.nnodes), "--rdzv-backend", "c10d"]
        argv += ["--rdzv-endpoint", f"{_host_for_endpoint(rdzv.addr)}:{rdzv.port}", "--rdzv-id", rdzv.rdzv_id]
        if rdzv.node_rank is not None:
            argv += ["--rdzv-conf", f"is_host={'true' if rdzv.node_rank == 0 else 'false'}"]
        if rdzv.local_addr:
            argv += ["--local-addr", rdzv.local_addr]
    elif rdzv.port is not None:
        assert rdzv.addr is not None
        # static, not c10d: with c10d torch hands the workers a *different*, ephemeral MASTER_PORT; with
        # static the workers' MASTER_PORT is exactly this (leased or user-given) port
        argv += ["--nnodes", "1", "--rdzv-backend", "static", "--node-rank", "0"]
        argv += ["--master-addr", rdzv.addr, "--master-port", str(rdzv.port)]
    else:
        argv += ["--standalone"]
    argv += ["--max-restarts", str(max_restarts), "--log-dir", str(error_dir)]
    if shutdown_timeout_s is not None:
        argv += ["--shutdown-timeout", str(max(int(shutdown_timeout_s), 0))]  # torchrun takes whole seconds

    if prefix_ranks:
        # `-mMODULE` and `--opt=value` start with "-", so torch names the job after the first other
        # argument, the label: "train.py FAILED" as with plain torchrun, not "podguard.launch.torchrun.command"
        wrap = [sys.executable, "-mpodguard.launch.torchrun.command", cmd.target, f"--prefix={rank_prefix}"]
        if log_dir is not None:
            wrap.append(f"--log-dir={log_dir}")
        if not selection.cpu_only:
            wrap.append("--gpus=" + ",".join(str(i) for i in selection.indices))
        if only_local_ranks is not None:
            wrap.append("--show=" + (",".join(str(r) for r in sorted(only_local_ranks)) or "none"))
        argv += ["--no-python", *wrap, "--", *cmd.worker_argv(agent_python)]
    else:
        if only_local_ranks is not None and only_local_ranks:
            # without tee/redirects torch sends the other ranks' output to /dev/null (no log file at all)
            argv += ["--local-ranks-filter", ",".join(str(r) for r in sorted(only_local_ranks))]
        argv += cmd.torchrun_tail()

    env: dict[str, str] = dict(selection.child_env())
    env["TORCHELASTIC_ERROR_FILE"] = str(reply)
    env["PYTHONUNBUFFERED"] = "1"  # the agent's own log lines arrive in order with the workers'
    if workers > 1 and "OMP_NUM_THREADS" not in env_in:
        env["OMP_NUM_THREADS"] = "1"  # what torchrun would set anyway, without its 5-line banner
    if extra_env:
        env.update(extra_env)
    return WorkerSpec(
        name=AGENT_NAME,
        argv=tuple(argv),
        env=env,
        prefix="",  # workers' lines carry their rank prefix already; the agent's own lines stay plain
        log_path=Path(log_dir) / "torchrun.log" if log_dir is not None else None,
    )


def _host_for_endpoint(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


# --------------------------------------------------------------------------------------------------
# Explaining a failed torchrun job


@dataclass(frozen=True)
class RankFailure:
    """What podguard could recover about the worker that failed first."""

    rank: int | None
    local_rank: int | None
    node_rank: int | None
    exitcode: int | None  # torch convention: negative = killed by that signal
    pid: int | None
    message: str  # "ValueError: bad batch" when an error file had it, else ""
    source: str  # "podguard exit record", "torch reply file" or "torchrun output"
    tail: tuple[str, ...] = ()

    @property
    def shell_code(self) -> int | None:
        if self.exitcode is None:
            return None
        return signal_exit_code(-self.exitcode) if self.exitcode < 0 else self.exitcode

    def describe(self) -> str:
        if self.rank is not None:
            who = f"rank {self.rank}"
            extra = []
            if self.local_rank is not None:
                extra.append(f"local rank {self.local_rank}")
            if self.node_rank is not None:
                extra.append(f"node {self.node_rank}")
            if extra:
                who += f" ({', '.join(extra)})"
        elif self.local_rank is not None:
            who = f"local rank {self.local_rank}"
        else:
            who = "a worker"
        if self.exitcode is None:
            how = "failed (its exit code was not recorded; torchrun exit code 1 kept)"
        elif self.exitcode < 0:
            how = f"was killed by signal {-self.exitcode} ({_signal_name(-self.exitcode)})"
        else:
            how = f"exited with code {self.exitcode}"
        text = f"{who} {how}"
        if self.message:
            text += f": {self.message}"
        return text


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _error_message(data: dict | None) -> tuple[str, int | None]:
    """(message, errorCode) from a torch error/reply file; tolerate both message formats."""
    if not data:
        return "", None
    msg = data.get("message")
    if isinstance(msg, dict):
        text = str(msg.get("message") or "")
        code = msg.get("errorCode")
        return _one_line(text), code if isinstance(code, int) and not isinstance(code, bool) else None
    if isinstance(msg, str) and msg != "<NONE>":
        return _one_line(msg), None
    return "", None


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _latest_attempt(error_dir: Path) -> Path | None:
    """The newest `<run>/attempt_<n>` directory torchrun made under its --log-dir."""
    best: tuple[float, int, Path] | None = None
    try:
        runs = [p for p in error_dir.iterdir() if p.is_dir()]
    except OSError:
        return None
    for run in runs:
        try:
            attempts = [p for p in run.iterdir() if p.is_dir() and p.name.startswith("attempt_")]
        except OSError:
            continue
        for att in attempts:
            try:
                key = (run.stat().st_mtime, int(att.name.removeprefix("attempt_")), att)
            except (OSError, ValueError):
                continue
            if best is None or key[:2] > best[:2]:
                best = key
    return best[2] if best else None


def _local_rank_dirs(attempt: Path) -> dict[int, Path]:
    out: dict[int, Path] = {}
    with contextlib.suppress(OSError):
        for p in attempt.iterdir():
            if p.is_dir() and p.name.isdigit():
                out[int(p.name)] = p
    return out


def _from_exit_records(ranks: dict[int, Path]) -> RankFailure | None:
    """The earliest failed worker according to the rank wrapper's exit records (exact times, codes)."""
    failed: list[tuple[float, dict]] = []
    for local_rank, d in ranks.items():
        rec = _read_json(d / EXIT_FILE)
        if not rec:
            continue
        code, sig = rec.get("exitcode"), rec.get("signal")
        if sig is None and not code:
            continue
        rec.setdefault("local_rank", local_rank)
        failed.append((float(rec.get("time") or 0.0), rec))
    if not failed:
        return None
    _, rec = min(failed, key=lambda item: item[0])
    sig = rec.get("signal")
    exitcode = -int(sig) if sig is not None else int(rec.get("exitcode") or 0)
    local_rank = _int_or_none(rec.get("local_rank"))
    message = ""
    if local_rank is not None and local_rank in ranks:
        message, _ = _error_message(_read_json(ranks[local_rank] / "error.json"))
    return RankFailure(
        rank=_int_or_none(rec.get("rank")),
        local_rank=local_rank,
        node_rank=_int_or_none(rec.get("group_rank")) if (_int_or_none(rec.get("nnodes")) or 1) > 1 else None,
        exitcode=exitcode,
        pid=_int_or_none(rec.get("pid")),
        message=message,
        source="podguard exit record",
        tail=tuple(str(x) for x in rec.get("tail") or ()),
    )


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _from_reply_file(error_dir: Path, ranks: dict[int, Path]) -> RankFailure | None:
    """The agent's reply file: the root-cause worker's error.json plus errorCode (its exit code)."""
    data = _read_json(error_dir / REPLY_FILE)
    message, code = _error_message(data)
    if code is None:
        return None
    # the local rank is the directory of the worker error.json with the same content
    local_rank = None
    inner = data.get("message") if data else None
    for lr, d in sorted(ranks.items()):
        worker = _read_json(d / "error.json")
        if worker and isinstance(inner, dict) and isinstance(worker.get("message"), dict):
            w = worker["message"]
            if w.get("message") == inner.get("message") and w.get("extraInfo") == inner.get("extraInfo"):
                local_rank = lr
                break
    return RankFailure(None, local_rank, None, code, None, message, "torch reply file")


_AGENT_SIGNAL_RE = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
_ROOT_RE = re.compile(r"Root Cause \(first observed failure\)")
_RANK_RE = re.compile(r"\brank\s*:\s*(-?\d+)\s*\(local_rank:\s*(-?\d+)\)")
_CODE_RE = re.compile(r"\bexitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_TRACE_RE = re.compile(r"\btraceback\s*:\s*(.*)$")


def _from_summary(lines: Sequence[str]) -> RankFailure | None:
    """Parse the "Root Cause" block of torchrun's ChildFailedError summary (no error files needed)."""
    start = None
    for i, line in enumerate(lines):
        if _ROOT_RE.search(line):
            start = i
    if start is None:
        return None
    rank = local_rank = code = pid = None
    message = ""
    for line in lines[start + 1 :]:
        if rank is None and (m := _RANK_RE.search(line)):
            rank, local_rank = int(m.group(1)), int(m.group(2))
        elif code is None and (m := _CODE_RE.search(line)):
            code, pid = int(m.group(1)), int(m.group(2))
        elif m := _TRACE_RE.search(line):
            text = m.group(1).strip()
            if text and not text.startswith(("To enable traceback", "Traceback (most recent")):
                message = _one_line(text)
            break
    if code is None:
        return None
    return RankFailure(rank, local_rank, None, code, pid, message, "torchrun output")


def explain_torchrun_failure(outcome: JobOutcome, error_dir: Path) -> JobOutcome:
    """Turn torchrun's exit 1 into the failing rank's real exit code and a one-line detail.

    Sources, most exact first: podguard's per-rank exit records (exact exit time, code or signal, rank,
    last lines), torch's reply file (`errorCode`, only when the root-cause worker used `@record`), and
    the ChildFailedError summary in the agent's last output lines. The exception message comes from the
    worker's error.json when it exists. Nothing found: the code stays 1 and the detail says so.
    torchrun itself ended by a signal (its SignalException, exit 1) becomes 128+N. A success, a job
    ended by a signal to podguard, an agent podguard stopped or that died by a signal is left as is.
    """
    if outcome.exit_code == 0 or outcome.signal is not None:
        return outcome
    agent = outcome.root_cause or next((w for w in outcome.workers if w.name == AGENT_NAME), None)
    if agent is None or agent.signal is not None or agent.returncode != 1 or agent.stopped_by_podguard:
        return outcome
    error_dir = Path(error_dir)
    reply_msg, _ = _error_message(_read_json(error_dir / REPLY_FILE))
    for line in [reply_msg, *reversed(agent.tail)]:  # the agent records its own exception in the reply file
        if m := _AGENT_SIGNAL_RE.search(line):
            # torchrun turns a signal it received into SignalException and exit 1, after stopping the
            # workers: the job was ended by that signal, whatever the stopped workers' statuses say
            sig = int(m.group(1))
            detail = f"torchrun was ended by signal {sig} ({_signal_name(sig)}) and stopped its workers"
            return dataclasses.replace(outcome, exit_code=signal_exit_code(sig), detail=detail)

    attempt = _latest_attempt(error_dir)
    ranks = _local_rank_dirs(attempt) if attempt else {}
    summary = _from_summary(agent.tail)
    found = _from_exit_records(ranks) or _from_reply_file(error_dir, ranks) or summary
    if found is None:
        last = reply_msg or next((ln.strip() for ln in reversed(agent.tail) if ln.strip()), "")
        detail = (
            "torchrun exited 1 and no failing rank could be identified (no torch error file, no "
            "ChildFailedError summary in its output); exit code 1 kept"
        )
        if last:
            detail += f"; last: {_one_line(last, 200)}"
        return dataclasses.replace(outcome, detail=detail)

    # fill what one source lacks from another (the global rank is only in the summary when no record)
    if summary is not None and found is not summary and (found.local_rank in (None, summary.local_rank)):
        found = dataclasses.replace(
            found,
            rank=found.rank if found.rank is not None else summary.rank,
            local_rank=found.local_rank if found.local_rank is not None else summary.local_rank,
            pid=found.pid if found.pid is not None else summary.pid,
            message=found.message or summary.message,
        )
    if not found.message and found.local_rank is not None and found.local_rank in ranks:
        found = dataclasses.replace(
            found, message=_error_message(_read_json(ranks[found.local_rank] / "error.json"))[0]
        )

    code = found.shell_code
    name = f"rank{found.rank}" if found.rank is not None else (
        f"local_rank{found.local_rank}" if found.local_rank is not None else AGENT_NAME
    )  # fmt: skip
    root = WorkerExit(
        name=name,
        pid=found.pid if found.pid is not None else agent.pid,
        returncode=found.exitcode if found.exitcode is not None and found.exitcode >= 0 else None,
        signal=-found.exitcode if found.exitcode is not None and found.exitcode < 0 else None,
        tail=found.tail or agent.tail,
    )
    if code is None:
        root = dataclasses.replace(root, returncode=1)
    detail = f"{found.describe()} [from {found.source}]"
    return dataclasses.replace(outcome, exit_code=code if code is not None else 1, root_cause=root, detail=detail)


# --------------------------------------------------------------------------------------------------
# The rank wrapper: `python -mpodguard.launch.torchrun.command LABEL [--prefix=..] [--log-dir=..] [--gpus=..]
# [--show=..] -- CMD...`


class _Stream:
    """One of the worker's pipes, cut into whole lines (`\\n`, `\\r\\n` and bare `\\r` end a line)."""

    def __init__(self, src: int, dst: int, prefix: bytes, show: bool, log, tail: deque[str]) -> None:
        self.src, self.dst, self.prefix, self.show, self.log, self.tail = src, dst, prefix, show, log, tail
        self.partial = b""
        self.after_cr = False
        self.dst_ok = True
        self.room = max(64, PIPE_BUF - len(prefix) - 1)  # payload bytes per atomic write

    def feed(self, data: bytes, final: bool = False) -> None:
        buf = self.partial + data
        lines: list[bytes] = []
        pos = 0
        for m in re.finditer(rb"\r\n|\r|\n", buf):
            seg = buf[pos : m.start()]
            pos = m.end()
            if self.after_cr and not seg and m.group() == b"\n" and m.start() == 0 and not lines:
                self.after_cr = False  # the \n of a \r\n split across two reads
                continue
            self.after_cr = m.group() == b"\r"
            if not seg and m.group() == b"\r":
                continue  # an empty progress-bar redraw
            lines.append(seg)
        self.partial = buf[pos:]
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        while len(self.partial) >= self.room:  # a very long line: pass it on in pieces, never hold it all
            cut = _utf8_cut(self.partial, self.room)
            lines.append(self.partial[:cut])
            self.partial = self.partial[cut:]
        if lines:
            self._emit(lines)

    def _emit(self, lines: list[bytes]) -> None:
        out: list[bytes] = []
        size = 0
        for line in lines:
            if self.log is not None:
                self.log.write(line + b"\n")
            self.tail.append(line.decode("utf-8", "replace"))
            while True:
                piece_len = _utf8_cut(line, self.room) if len(line) > self.room else len(line)
                piece = self.prefix + line[:piece_len] + b"\n"
                if size + len(piece) > PIPE_BUF and out:
                    self._write(b"".join(out))
                    out, size = [], 0
                out.append(piece)
                size += len(piece)
                line = line[piece_len:]
                if not line:
                    break
        if out:
            self._write(b"".join(out))

    def _write(self, data: bytes) -> None:
        if not (self.show and self.dst_ok):
            return
        try:
            os.write(self.dst, data)  # <= PIPE_BUF: one atomic write, never interleaved with other ranks
        except OSError:
            self.dst_ok = False  # the reader is gone; keep draining the worker so it never blocks


def _utf8_cut(data: bytes, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 character."""
    cut = min(limit, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut or min(limit, len(data))


def _rank_wrap_main(argv: list[str]) -> int:
    """Run one worker, prefixing its lines, and end exactly as it ended (code or signal)."""
    import selectors
    import subprocess

    opts: dict[str, str] = {}
    try:
        sep = argv.index("--")
    except ValueError:
        sep = len(argv)
    for item in argv[:sep]:
        key, eq, value = item.partition("=")
        if item.startswith("--") and eq:
            opts[key] = value
        # anything else is the label (the user's script), there only for torch's job name
    cmd = argv[sep + 1 :]
    if not cmd:
        print("podguard rank wrapper: no command after --", file=sys.stderr)
        return 64

    env = os.environ
    rank = int(env.get("RANK", "0") or 0)
    local_rank = int(env.get("LOCAL_RANK", "0") or 0)
    group_rank = int(env.get("GROUP_RANK", "0") or 0)
    gpus = [g for g in opts.get("--gpus", "").split(",") if g]
    gpu = gpus[local_rank] if local_rank < len(gpus) else "cpu"
    fields = {"rank": rank, "local_rank": local_rank, "node_rank": group_rank, "gpu": gpu}
    prefix = opts.get("--prefix", DEFAULT_RANK_PREFIX).format(**fields).encode()
    show_opt = opts.get("--show")
    show = show_opt is None or str(local_rank) in show_opt.split(",")

    log = None
    if opts.get("--log-dir"):
        with contextlib.suppress(OSError):
            log = open(Path(opts["--log-dir"]) / f"rank{rank}.log", "ab")  # noqa: SIM115
    child_env = dict(env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")

    # a no-op handler (not SIG_IGN, which the worker would inherit): torchrun signals the whole process
    # group, so the worker gets every signal directly; the wrapper just outlives it to flush and mirror
    def _noop(signum: int, frame: object) -> None:
        return None

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, _noop)

    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env)
    except OSError as exc:
        print(f"{prefix.decode()}podguard: cannot start {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126

    tail: deque[str] = deque(maxlen=TAIL_LINES)
    assert proc.stdout is not None and proc.stderr is not None
    streams = {
        proc.stdout.fileno(): _Stream(proc.stdout.fileno(), 1, prefix, show, log, tail),
        proc.stderr.fileno(): _Stream(proc.stderr.fileno(), 2, prefix, show, log, tail),
    }
    sel = selectors.DefaultSelector()
    for fd in streams:
        sel.register(fd, selectors.EVENT_READ)
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    status: int | None = None
    exit_time = 0.0
    drain_deadline: float | None = None
    while streams:
        timeout = 0.1 if pidfd is None else None
        if drain_deadline is not None:
            timeout = max(0.0, drain_deadline - time.monotonic())
        events = sel.select(timeout)
        for key, _ in events:
            fd = key.fd
            if fd == pidfd:
                sel.unregister(pidfd)
                continue
            data = os.read(fd, 65536)
            if data:
                streams[fd].feed(data)
            else:
                streams.pop(fd).feed(b"", final=True)
                sel.unregister(fd)
        if status is None:
            status = proc.poll()
            if status is not None:
                exit_time = time.time()  # when it ended, not when its output was drained
            if status is not None and streams:
                # grandchildren (data loader workers) may hold the pipes open: drain briefly, then go
                drain_deadline = time.monotonic() + 0.5
        if drain_deadline is not None and time.monotonic() >= drain_deadline:
            for fd, stream in list(streams.items()):
                stream.feed(b"", final=True)
                streams.pop(fd)
            break
    if status is None:
        status = proc.wait()
        exit_time = time.time()
    if log is not None:
        with contextlib.suppress(OSError):
            log.close()

    record = {
        "rank": rank,
        "local_rank": local_rank,
        "group_rank": group_rank,
        "nnodes": int(env.get("GROUP_WORLD_SIZE", "1") or 1),
        "pid": proc.pid,
        "exitcode": status if status >= 0 else None,
        "signal": -status if status < 0 else None,
        "time": exit_time,
        "tail": list(tail),
    }
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        target = Path(error_file).parent / EXIT_FILE
        with contextlib.suppress(OSError):
            tmp = target.with_name(f".{EXIT_FILE}.{os.getpid()}")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, target)

    if status < 0:
        sig = -status
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return signal_exit_code(sig)
    return status


if __name__ == "__main__":
    sys.exit(_rank_wrap_main(sys.argv[1:]))

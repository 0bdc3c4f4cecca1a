"""Turn torchrun's "exit 1 for every failure" into the failing rank and its real exit code.

    outcome = explain_torchrun_failure(run_job([spec]), error_dir)
    outcome.exit_code, outcome.detail     # 3, "rank 1 (local rank 1) exited with code 3: ValueError: ..."

Sources, most exact first: the rank wrapper's exit records, torch's reply file (`errorCode`), and the
"Root Cause" block of torchrun's ChildFailedError summary. What torch 2.13 writes where: docs/torchrun.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from podguard.errors import ExitCode, signal_exit_code
from podguard.launch.signals import signal_name
from podguard.launch.spec import JobOutcome, WorkerExit
from podguard.launch.torchrun.command import AGENT_NAME, REPLY_FILE
from podguard.rank.wrap import EXIT_FILE

__all__ = ["FailureSource", "RankFailure", "explain_torchrun_failure"]


class FailureSource(StrEnum):
    EXIT_RECORD = "podguard exit record"
    REPLY_FILE = "torch reply file"
    SUMMARY = "torchrun output"


@dataclass(frozen=True)
class RankFailure:
    """What podguard could recover about the worker that failed first."""

    rank: int | None
    local_rank: int | None
    node_rank: int | None
    exitcode: int | None  # torch convention: negative = killed by that signal
    pid: int | None
    message: str  # "ValueError: bad batch" when an error file had it, else ""
    source: FailureSource
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
            how = f"was killed by signal {-self.exitcode} ({signal_name(-self.exitcode)})"
        else:
            how = f"exited with code {self.exitcode}"
        text = f"{who} {how}"
        if self.message:
            text += f": {self.message}"
        return text


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
        source=FailureSource.EXIT_RECORD,
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
    return RankFailure(None, local_rank, None, code, None, message, FailureSource.REPLY_FILE)


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
    return RankFailure(rank, local_rank, None, code, pid, message, FailureSource.SUMMARY)


_PEER_LOST_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"NCCL communicator was aborted|Socket Timeout|ECONNRESET",
    re.IGNORECASE,
)
PEER_LOST_HINT = "a peer rank was lost: in a multi-node job another node may have failed first (see its output)"


def _agent_of(outcome: JobOutcome) -> WorkerExit | None:
    """The torchrun agent's exit when it ended with torch's generic exit 1 on its own, else None."""
    if outcome.exit_code == 0 or outcome.signal is not None:
        return None
    agent = outcome.root_cause or next((w for w in outcome.workers if w.name == AGENT_NAME), None)
    if agent is None or agent.signal is not None or agent.stopped_by_podguard:
        return None
    return agent if agent.returncode == ExitCode.FAILURE else None


def _agent_signal(reply_msg: str, agent: WorkerExit) -> int | None:
    """torchrun turns a signal it received into SignalException and exit 1, after stopping its workers."""
    for line in [reply_msg, *reversed(agent.tail)]:  # the agent records its own exception in the reply file
        if m := _AGENT_SIGNAL_RE.search(line):
            return int(m.group(1))
    return None


def _complete(found: RankFailure, summary: RankFailure | None, ranks: dict[int, Path]) -> RankFailure:
    """Fill what one source lacks from another (the global rank is only in the summary without a record)."""
    if summary is not None and found is not summary and found.local_rank in (None, summary.local_rank):
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
    return found


def _root_exit(found: RankFailure, agent: WorkerExit) -> WorkerExit:
    if found.rank is not None:
        name = f"rank{found.rank}"
    else:
        name = f"local_rank{found.local_rank}" if found.local_rank is not None else AGENT_NAME
    known = found.exitcode is not None
    return WorkerExit(
        name=name,
        pid=found.pid if found.pid is not None else agent.pid,
        returncode=found.exitcode if known and found.exitcode >= 0 else (None if known else ExitCode.FAILURE),
        signal=-found.exitcode if known and found.exitcode < 0 else None,
        tail=found.tail or agent.tail,
    )


def _nothing_found(outcome: JobOutcome, agent: WorkerExit, reply_msg: str) -> JobOutcome:
    last = reply_msg or next((ln.strip() for ln in reversed(agent.tail) if ln.strip()), "")
    detail = (
        "torchrun exited 1 and no failing rank could be identified (no torch error file, no "
        "ChildFailedError summary in its output); exit code 1 kept"
    )
    if last:
        detail += f"; last: {_one_line(last, 200)}"
    return dataclasses.replace(outcome, detail=detail)


def explain_torchrun_failure(outcome: JobOutcome, error_dir: Path) -> JobOutcome:
    """Turn torchrun's exit 1 into the failing rank's real exit code and a one-line detail.

    Sources, most exact first: podguard's per-rank exit records (exact exit time, code or signal, rank,
    last lines), torch's reply file (`errorCode`, only when the root-cause worker used `@record`), and
    the ChildFailedError summary in the agent's last output lines. The exception message comes from the
    worker's error.json when it exists. Nothing found: the code stays 1 and the detail says so.
    torchrun itself ended by a signal (its SignalException, exit 1) becomes 128+N. A success, a job
    ended by a signal to podguard, an agent podguard stopped or that died by a signal is left as is.
    """
    agent = _agent_of(outcome)
    if agent is None:
        return outcome
    error_dir = Path(error_dir)
    reply_msg, _ = _error_message(_read_json(error_dir / REPLY_FILE))
    sig = _agent_signal(reply_msg, agent)
    if sig is not None:  # the job was ended by that signal, whatever the stopped workers' statuses say
        detail = f"torchrun was ended by signal {sig} ({signal_name(sig)}) and stopped its workers"
        return dataclasses.replace(outcome, exit_code=signal_exit_code(sig), detail=detail)
    attempt = _latest_attempt(error_dir)
    ranks = _local_rank_dirs(attempt) if attempt else {}
    summary = _from_summary(agent.tail)
    found = _from_exit_records(ranks) or _from_reply_file(error_dir, ranks) or summary
    if found is None:
        return _nothing_found(outcome, agent, reply_msg)
    found = _complete(found, summary, ranks)
    root = _root_exit(found, agent)
    detail = f"{found.describe()} [from {found.source}]"
    if any(_PEER_LOST_RE.search(line) for line in (found.message, *root.tail)):
        detail += f"; {PEER_LOST_HINT}"
    code = found.shell_code
    return dataclasses.replace(
        outcome, exit_code=code if code is not None else ExitCode.FAILURE, root_cause=root, detail=detail
    )

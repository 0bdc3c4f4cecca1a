"""The job's last word and its restarts, as lines a keeper outside the pod reads (docs/formats.md, "END and
RESTART lines"). Both sides of that contract import this module: job/ending.py writes the END line,
job/conductor.py the RESTART lines, pods/keeper/lines.py reads them. It sits low in the package and imports only
errors.py (the exit codes).

    podguard train: RESTART 1 of 3 in 1 s after crash (exit 1), exit 1
    podguard train: END success exit 0 after 2 attempt(s): job finished successfully in 812.4 s (8 worker(s))

Exactly one END line per `train`/`run` invocation that launched or decided anything, printed when the outcome is
known (before `--on-exit` or a guard stops the pod); a RESTART line for each relaunch. KIND is an `EndKind`;
`END_CODES` says the exit code each kind ends with where the kind has one of its own.
`signal` is an end imposed from outside (RunPod's SIGTERM when it stops the pod), not an outcome. The END line is
one line under MAX_LINE characters: the detail is cut (its start kept, "…" at the end).

With `--checkpoints` the detail holds `newest checkpoint <path> (step <N>, written <UTC time>)`;
`newest_checkpoint(detail)` reads it back (a keeper's notifications name it). With `--checkpoint-store` it also holds
`stored <name> (step <N>, written <UTC time>) in <URL>`; `stored_checkpoint(detail)` reads that back (its path: the
store's URL of the checkpoint, what a replacement pod comes back from).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from podguard.errors import ExitCode

__all__ = [
    "END_CODES",
    "END_LINE",
    "KINDS",
    "MAX_LINE",
    "Checkpoint",
    "EndKind",
    "end_line",
    "newest_checkpoint",
    "restart_line",
    "stored_checkpoint",
]


class EndKind(StrEnum):
    """How a `train`/`run` ended: the KIND of its END line (a keeper reads it: pods/keeper/)."""

    SUCCESS = "success"  # the job finished (or had finished before: not run again)
    FAILED = "failed"  # a worker failed: the job's own exit code
    HUNG = "hung"  # no progress for --hang-timeout
    GPU_FAULT = "gpu-fault"  # a fatal GPU fault during the run
    GUARD = "guard"  # a billing guard ended the job
    SIGNAL = "signal"  # an end imposed from outside: 128+N
    PREFLIGHT = "preflight"  # refused before the launch: bad configuration (64) or the preflight's verdict


# The exit code each END kind ends with. None: the code is not the kind's own but the job's (failed), the
# signal's (128+N) or the refusal's (64, 69, 75, 76 ...).
END_CODES: dict[EndKind, int | None] = {
    EndKind.SUCCESS: ExitCode.OK,
    EndKind.FAILED: None,
    EndKind.HUNG: ExitCode.HUNG,
    EndKind.GPU_FAULT: ExitCode.GPU_UNHEALTHY,
    EndKind.GUARD: ExitCode.BILLING_GUARD,
    EndKind.SIGNAL: None,
    EndKind.PREFLIGHT: None,
}
KINDS = tuple(kind.value for kind in EndKind)
END_LINE = re.compile(r"^podguard (?P<command>train|run): END (?P<kind>[a-z-]+) exit (?P<code>\d+)\b")
MAX_LINE = 399  # an END line stays under 400 characters (the keeper reads it as one log line)
_STORED = re.compile(r"(?:^|; )stored (\S+) \((?:step (\d+), )?written (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\) in (\S+)")
_NEWEST = re.compile(r"newest checkpoint (\S(?:.*?\S)?) \((?:step (\d+), )?written (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\)")


def end_line(command: str, kind: EndKind | str, code: int, attempts: int, detail: str) -> str:
    """`podguard COMMAND: END KIND exit CODE after N attempt(s)[: detail]`, one line of at most MAX_LINE chars."""
    if kind not in KINDS:
        raise ValueError(f"unknown end kind {kind!r}; one of {', '.join(KINDS)}")
    head = f"podguard {command}: END {EndKind(kind).value} exit {int(code)} after {attempts} attempt(s)"
    detail = " ".join(detail.split())
    if not detail:
        return head
    room = MAX_LINE - len(head) - 2
    if len(detail) > room:
        detail = detail[: max(room - 1, 0)].rstrip() + "…"
    return f"{head}: {detail}"


def restart_line(command: str, number: int, total: int, delay_s: float, what: str, code: int) -> str:
    what = " ".join(what.split())
    return f"podguard {command}: RESTART {number} of {total} in {delay_s:g} s after {what}, exit {int(code)}"


@dataclass(frozen=True)
class Checkpoint:
    """The newest whole checkpoint an END line names: where, its step when known, when it was written (epoch s)."""

    path: str
    step: int | None
    written: float

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1] or self.path


def newest_checkpoint(text: str) -> Checkpoint | None:
    """The `newest checkpoint PATH (step N, written T)` fragment of an END line's detail, or None."""
    m = _NEWEST.search(text)
    if m is None:
        return None
    written = datetime.strptime(m.group(3), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    return Checkpoint(m.group(1), int(m.group(2)) if m.group(2) else None, written)


def stored_checkpoint(text: str) -> Checkpoint | None:
    """The `stored NAME (step N, written T) in URL` fragment (--checkpoint-store) as a Checkpoint whose path is the
    checkpoint's URL in the store, or None."""
    m = _STORED.search(text)
    if m is None:
        return None
    written = datetime.strptime(m.group(3), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    return Checkpoint(f"{m.group(4).rstrip('/')}/{m.group(1)}", int(m.group(2)) if m.group(2) else None, written)

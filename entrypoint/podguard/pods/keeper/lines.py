"""podguard's own lines in a pod's log, as the keeper reads them (never any other line).

    cue = read_line("podguard train: END success exit 0 after 1 attempt(s): job finished")
    cue.kind, cue.word, cue.code          # Cue.END, "success", 0

Four lines count, each defined where the pod prints it (formats kept stable: docs/running-pods.md):
- the preflight summary's first line, `podguard <train|run>: <PASS|BUSY|UNHEALTHY|FAIL> ...` (preflight/report.py);
- the END line, exactly one per `train`/`run` when the outcome is known,
  `podguard <train|run>: END <kind> exit <code> after <n> attempt(s)[: detail]` (outcome_lines.py);
- a RESTART line, `podguard <train|run>: RESTART <n> of <N> in <s> s after ...`: an in-pod relaunch, not the end;
- the billing guard's line, `podguard: billing guard --idle-stop|--max-runtime|--max-cost: ...` (guards/watch.py),
  printed when a guard fires, before the job is ended and the pod stopped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from podguard.outcome_lines import END_LINE, KINDS, EndKind

__all__ = ["Cue", "CueKind", "read_line"]

# Anchored at the start of the line: a job that prints "podguard train: END success" inside its own text
# (a quoted log, an f-string) mid-line is not podguard speaking.
_VERDICT = re.compile(r"^podguard (?P<command>train|run): (?P<word>PASS|BUSY|UNHEALTHY|FAIL)\b")
_RESTART = re.compile(r"^podguard (?P<command>train|run): RESTART (?P<n>\d+) of (?P<of>\d+)\b")
_GUARD = re.compile(r"^podguard: billing guard (?P<guard>--idle-stop|--max-runtime|--max-cost):")


class CueKind(StrEnum):
    VERDICT = "verdict"  # word: PASS | BUSY | UNHEALTHY | FAIL
    END = "end"  # word: an outcome_lines.EndKind; code: the exit code
    RESTART = "restart"  # word: "<n> of <N>"
    GUARD = "guard"  # word: the guard's option


@dataclass(frozen=True)
class Cue:
    kind: CueKind
    word: str
    code: int | None
    line: str


def read_line(line: str) -> Cue | None:
    """The cue in one log line, or None when it is not one of podguard's own decisive lines."""
    text = line.strip()
    if not text.startswith("podguard"):
        return None
    m = END_LINE.match(text)
    if m is not None and m.group("kind") in KINDS:
        return Cue(CueKind.END, EndKind(m.group("kind")), int(m.group("code")), text)
    m = _VERDICT.match(text)
    if m is not None:
        return Cue(CueKind.VERDICT, m.group("word"), None, text)
    m = _RESTART.match(text)
    if m is not None:
        return Cue(CueKind.RESTART, f"{m.group('n')} of {m.group('of')}", None, text)
    m = _GUARD.match(text)
    if m is not None:
        return Cue(CueKind.GUARD, m.group("guard"), None, text)
    return None

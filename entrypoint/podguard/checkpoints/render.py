"""How the finder's answer is said: the line before each attempt, the variables the job gets, the END fragment,
and `podguard checkpoints DIR [--json]`. Pure: `now` is passed in."""

from __future__ import annotations

import time
from typing import Any

from podguard.checkpoints.checkpoint import Checkpoint, format_size
from podguard.checkpoints.scan import Finding
from podguard.durations import format_duration

__all__ = [
    "ENV_RESUME_FROM",
    "ENV_RESUME_STEP",
    "as_json",
    "end_fragment",
    "resume_env",
    "resume_lines",
    "table",
    "utc",
]

ENV_RESUME_FROM = "PODGUARD_RESUME_FROM"
ENV_RESUME_STEP = "PODGUARD_RESUME_STEP"


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _step(c: Checkpoint) -> str:
    return f"step {c.step}, " if c.step is not None else ""


def _own_why(c: Checkpoint) -> str:
    """A file's why without its own name again: `step_500.pt: its zip ...` -> `its zip ...`."""
    if c.why.startswith(f"{c.name}: "):
        return c.why[len(c.name) + 2 :]
    if c.why.startswith(f"{c.name} "):
        return "it" + c.why[len(c.name) :]
    return c.why


def resume_lines(finding: Finding, now: float) -> list[str]:
    """`skipping <name>: <why>` for each newer broken one, then `resuming from ...` or `no checkpoint yet in DIR`."""
    lines = [f"skipping {c.name}: {_own_why(c)}" for c in finding.skipped]
    chosen = finding.chosen
    if chosen is None:
        lines.append(f"no checkpoint yet in {finding.directory}")
    else:
        age = format_duration(max(0.0, now - chosen.mtime))
        lines.append(f"resuming from {chosen.path} ({_step(chosen)}written {age} ago)")
    return lines


def resume_env(finding: Finding) -> dict[str, str]:
    """PODGUARD_RESUME_FROM (and _STEP when known) for the chosen checkpoint; {} when there is none."""
    chosen = finding.chosen
    if chosen is None:
        return {}
    env = {ENV_RESUME_FROM: chosen.path}
    if chosen.step is not None:
        env[ENV_RESUME_STEP] = str(chosen.step)
    return env


def end_fragment(started: Checkpoint | None, newest: Checkpoint | None) -> str:
    """The END line's detail fragment (a fixed format that `pod keep` parses: docs/checkpoints.md)."""
    parts = []
    if newest is not None:
        parts.append(f"newest checkpoint {newest.path} ({_step(newest)}written {utc(newest.mtime)})")
    else:
        parts.append("no checkpoint yet")
    parts.append(f"started from {started.path}" if started is not None else "started from scratch")
    return "; ".join(parts)


def as_json(finding: Finding, unreadable: str = "") -> dict[str, Any]:
    """`unreadable`: why DIR could not be listed ("" when it could)."""
    chosen = finding.chosen
    return {
        "directory": finding.directory,
        "unreadable": unreadable or None,
        "resume_from": chosen.path if chosen is not None else None,
        "resume_step": chosen.step if chosen is not None else None,
        "checkpoints": [
            {
                "path": c.path,
                "layout": str(c.layout),
                "step": c.step,
                "size_bytes": c.size,
                "written_at": utc(c.mtime),
                "whole": c.whole,
                "why_not": c.why or None,
                "note": c.note or None,
                "chosen": c is chosen,
            }
            for c in finding.checkpoints
        ],
    }


def table(finding: Finding, now: float, unreadable: str = "") -> str:
    """Newest first, one row each, then which one a restart would use."""
    if unreadable:
        return f"cannot read {finding.directory} ({unreadable})\na restart would start from scratch"
    if not finding.checkpoints:
        return f"no checkpoints in {finding.directory}\na restart would start from scratch"
    chosen = finding.chosen
    rows = [("", "NAME", "LAYOUT", "STEP", "SIZE", "WRITTEN", "WHOLE")]
    for c in finding.checkpoints:
        mark = "*" if c is chosen else ""
        whole = "yes" + (f" ({c.note})" if c.note else "") if c.whole else f"no: {c.why}"
        written = f"{utc(c.mtime)} ({format_duration(max(0.0, now - c.mtime))} ago)"
        step = "-" if c.step is None else str(c.step)
        rows.append((mark, c.name, str(c.layout), step, format_size(c.size), written, whole))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = [" ".join(v.ljust(w) for v, w in zip(r[:6], widths, strict=True)) + " " + r[6] for r in rows]
    lines.append(f"in {finding.directory}")
    lines.append(f"a restart would resume from {chosen.path} (*)" if chosen else "a restart would start from scratch")
    return "\n".join(line.rstrip() for line in lines)

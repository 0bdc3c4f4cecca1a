"""The preflight report: a JSON record in the state dir and a short summary a person reads at a glance.

The JSON file is the durable record (what was checked, each GPU's verdict, timings, what was killed and
why); `latest.json` next to it always points at the newest so `podguard doctor` and a restarted
container can find it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podguard.state import subdir


@dataclass
class Timings:
    """Millisecond timings of each preflight phase, measured with a monotonic clock."""

    started: float = field(default_factory=time.perf_counter)
    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[name] = round((now - since) * 1000, 3)
        return now

    def total_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)


def write_report(state: Path, command: str, payload: dict[str, Any]) -> Path:
    """Write the report atomically (temp file + rename) and update latest.json the same way."""
    reports = subdir(state, "reports")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = reports / f"{stamp}-{os.getpid()}-{command}.json"
    data = json.dumps(payload, indent=2, sort_keys=False, default=str)
    for target in (path, reports / "latest.json"):
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(data)
        os.replace(tmp, target)
    _prune(reports)
    return path


KEEP_REPORTS = 200  # a container HEALTHCHECK runs `podguard health` every minute: keep the folder bounded


def _prune(reports: Path) -> None:
    """Delete all but the newest KEEP_REPORTS reports (names start with a sortable UTC timestamp)."""
    try:
        names = sorted(e.name for e in os.scandir(reports) if e.name.endswith(".json") and e.name[:1].isdigit())
    except OSError:
        return
    for name in names[:-KEEP_REPORTS]:
        with contextlib.suppress(OSError):
            (reports / name).unlink()


def na(value: object, unit: str = "") -> str:
    """A value NVML could not report prints as "n/a", never as None or a crash."""
    return "n/a" if value is None else f"{value}{unit}"


def _held(memory_mib: dict[str, float | None] | None) -> str:
    """ ", holding 4096 MiB" from a kill record's per-GPU memory (None where NVML did not say)."""
    known = [m for m in (memory_mib or {}).values() if m]
    return f", holding {sum(known):.0f} MiB" if known else ""


def format_summary(payload: dict[str, Any]) -> str:
    """A few lines: the verdict, one line per GPU that is not plainly healthy, kills, warnings, where to look."""
    lines: list[str] = []
    verdict = payload.get("verdict", "?")
    selection = payload.get("selection") or {}
    gpus = selection.get("gpus") or []
    total_ms = payload.get("timings_ms", {}).get("total")
    where = f"{len(gpus)} GPU(s)" if gpus else ("CPU only" if selection else "this node")
    head = f"podguard {payload.get('command', 'preflight')}: {verdict.upper()} on {where}"
    if total_ms is not None:
        head += f" in {total_ms:.0f} ms"
    lines.append(head)
    for warning in payload.get("warnings", []):
        lines.append(f"  ! {warning}")
    cleanup = payload.get("cleanup") or {}
    if cleanup.get("dry_run"):
        for target in cleanup.get("planned", []):
            lines.append(
                f"  would stop pid {target.get('pid')} ({(target.get('cmdline') or '')[:60]}) on GPU "
                f"{target.get('gpus')}: {target.get('reason', '')}"
            )
    for kill in cleanup.get("killed", []):
        gpus = ",".join(str(g) for g in kill.get("gpus", []))
        lines.append(
            f"  {kill.get('outcome', 'stopped')} pid {kill.get('pid')} ({kill.get('cmdline', '')[:60]})"
            f"{' on GPU ' + gpus if gpus else ''}{_held(kill.get('memory_mib'))}: {kill.get('reason', '')}"
        )
    for item in cleanup.get("unkillable", []):
        lines.append(f"  UNKILLABLE pid {item.get('pid')}: {item.get('reason', 'stuck in uninterruptible sleep')}")
    for gpu in payload.get("gate", {}).get("verdicts", []):
        if gpu["verdict"] != "healthy":
            lines.append(f"  GPU{gpu['index']} {gpu['verdict'].upper()}: {'; '.join(gpu['reasons'])}")
        for warning in gpu.get("warnings", []):
            lines.append(f"  GPU{gpu['index']} warning: {warning}")
    if payload.get("message"):
        lines.append(f"  {payload['message']}")
    for rec in payload.get("recommendations", []):
        lines.append(f"  -> {rec}")
    if payload.get("report_path"):
        lines.append(f"  report: {payload['report_path']}")
    return "\n".join(lines)

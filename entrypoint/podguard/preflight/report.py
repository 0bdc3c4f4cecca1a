"""The preflight report: a JSON record in the state dir and a short summary a person reads at a glance.

    path = write_report(state_dir(), "train", payload)   # None (plus one warning) on a full volume
    print(format_summary(payload))                      # "podguard train: PASS on 8 GPU(s) in 21 ms" ...

Reports are owner-only, written atomically (podguard.state.write_private), secrets masked
(podguard.redact); `latest.json` always names the newest, so `podguard doctor` and a restarted
container can find it. The first summary line's format is a contract (docs/formats.md): keep it stable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podguard.errors import ExitCode
from podguard.redact import redact_text
from podguard.state import subdir, write_private

__all__ = ["KEEP_REPORTS", "Timings", "format_summary", "na", "redact_data", "verdict_word", "write_report"]

KEEP_REPORTS = 200  # a container HEALTHCHECK runs `podguard health` every minute: keep the folder bounded

# Cheap test before the regexes: text that could hold a secret mentions one of these.
_SECRET_HINT = re.compile(
    r"token|key|secret|pass|pwd|auth|cred|cookie|session|bearer|basic|hf_|sk-|gh[pousr]_|github_pat|xox|akia|rpa_"
    r"|glpat|://",
    re.IGNORECASE,
)


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


def verdict_word(exit_code: int) -> str:
    """The summary line's verdict (docs/formats.md): PASS, BUSY, UNHEALTHY or FAIL."""
    return {ExitCode.OK: "PASS", ExitCode.GPUS_BUSY: "BUSY", ExitCode.GPU_UNHEALTHY: "UNHEALTHY"}.get(exit_code, "FAIL")


def redact_data(value: Any) -> Any:
    """A copy of JSON-ready data with every string passed through `podguard.redact.redact_text`."""
    if isinstance(value, str):
        return redact_text(value) if _SECRET_HINT.search(value) else value
    if isinstance(value, dict):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(v) for v in value]
    return value


def write_report(state: Path, command: str, payload: dict[str, Any]) -> Path | None:
    """Write the report and latest.json, owner-only and atomic, secrets masked. Best effort: on a full or
    read-only volume nothing half-written is left and one warning is added to `payload["warnings"]`."""
    data = json.dumps(redact_data(payload), indent=2, sort_keys=False, default=str)
    try:
        reports = subdir(state, "reports")
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = reports / f"{stamp}-{os.getpid()}-{command}.json"
        write_private(path, data)
        write_private(reports / "latest.json", data)
    except OSError as exc:
        payload.setdefault("warnings", []).append(
            f"could not write the report ({exc.strerror or exc}): the verdict stands, only its record is missing"
        )
        return None
    _prune(reports)
    return path


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


def _cleanup_lines(cleanup: dict[str, Any]) -> list[str]:
    lines = []
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
    return lines


def format_summary(payload: dict[str, Any]) -> str:
    """A few lines: the verdict, one line per GPU that is not plainly healthy, kills, warnings, what to do."""
    payload = redact_data(payload)
    selection = payload.get("selection") or {}
    gpus = selection.get("gpus") or []
    total_ms = payload.get("timings_ms", {}).get("total")
    where = f"{len(gpus)} GPU(s)" if gpus else ("CPU only" if selection else "this node")
    head = f"podguard {payload.get('command', 'preflight')}: {verdict_word(payload.get('exit_code', 1))} on {where}"
    if total_ms is not None:
        head += f" in {total_ms:.0f} ms"
    lines = [head]
    lines += [f"  ! {w}" for w in payload.get("warnings", [])]
    lines += _cleanup_lines(payload.get("cleanup") or {})
    for gpu in payload.get("gate", {}).get("verdicts", []):
        if gpu["verdict"] != "healthy":
            lines.append(f"  GPU{gpu['index']} {gpu['verdict'].upper().replace('_', ' ')}: {'; '.join(gpu['reasons'])}")
        lines += [f"  GPU{gpu['index']} warning: {w}" for w in gpu.get("warnings", [])]
    if payload.get("message"):
        lines.append(f"  {payload['message']}")
    lines += [f"  -> {rec}" for rec in payload.get("recommendations", [])]
    if payload.get("report_path"):
        lines.append(f"  report: {payload['report_path']}")
    return "\n".join(lines)

"""The parsers of single option values that need more than `cli/params.py`'s building blocks: each returns the
value or raises UsageError with one line naming the value and what is valid."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from podguard.cli.params import choice, parse_int, seconds
from podguard.durations import parse_duration
from podguard.errors import UsageError

__all__ = [
    "gpu_index",
    "metrics_file",
    "port",
    "positive_seconds",
    "rdzv_backend",
    "regex",
    "save_grace",
    "save_signal",
]


def save_signal(raw: Any) -> int | None:
    """USR1, SIGUSR1 or 10; none/off/empty: no save request. SIGKILL and SIGSTOP cannot be caught: refused."""
    text = "" if raw is None else str(raw).strip().upper()
    if text in ("", "NONE", "OFF"):
        return None
    try:
        name = text if text.startswith("SIG") else f"SIG{text}"
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[name]
    except (KeyError, ValueError):
        sig = None
    if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
        raise UsageError(f"--save-signal={raw!r} is not valid; expected a signal the job can catch, e.g. USR1 or USR2")
    return int(sig)


def save_grace(raw: Any) -> float:
    bad = UsageError(f"--save-grace={raw!r} is not valid; expected a duration > 0, e.g. 90s, 2m or 120")
    try:
        value = parse_duration(raw, "--save-grace")
    except UsageError:
        raise bad from None  # (parse_duration's own message offers "0 or off", which a grace cannot be)
    if value is None:
        raise bad
    return value


def regex(raw: Any, name: str) -> str | None:
    """A regular expression that compiles (kept as text; the watch compiles it), or None when empty."""
    if raw is None or str(raw) == "":
        return None
    try:
        re.compile(str(raw))
    except re.error as exc:
        raise UsageError(f"{name}={raw!r} is not a valid regular expression: {exc}") from None
    return str(raw)


def positive_seconds(raw: Any, name: str) -> float:
    value = seconds(name)(raw)
    if value <= 0:
        raise UsageError(f"{name}={raw} is not valid; expected a number of seconds > 0, e.g. 600")
    return value


def rdzv_backend(raw: Any) -> str:
    from podguard.launch.torchrun.rendezvous import RdzvBackend  # noqa: PLC0415  lazy: the CLI loads a command's modules when the command runs (torchrun mode)

    return str(choice(RdzvBackend, "--rdzv-backend")(raw))


def gpu_index(raw: Any) -> int:
    text = str(raw).strip()
    if not text.isdigit():
        raise UsageError(f"--only-gpu={raw!r} is not valid; expected a GPU index such as 2")
    return int(text)


def port(raw: Any) -> int:
    return parse_int(raw, "MASTER_PORT", 1, 65535)


def metrics_file(raw: Any) -> Path:
    """--metrics-file: a path that is not empty (an empty PODGUARD_METRICS_FILE is unset, like every variable);
    what is at the path is checked when the file is opened (metrics/textfile.py)."""
    if not str(raw).strip():
        raise UsageError(
            f"--metrics-file={raw!r} is empty; expected the path of the textfile, "
            "e.g. /var/lib/node_exporter/textfile/podguard.prom"
        )
    return Path(str(raw)).expanduser()

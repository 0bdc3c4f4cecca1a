"""Small shared pieces for the rank helpers: reading the distributed env and printing per-rank lines.

Kept free of torch (and of anything heavy) because every helper module imports it, and the helpers are
imported by training scripts before their own heavy imports.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from podguard.errors import UsageError


def env_int(name: str, default: int | None, *, minimum: int = 0, env: Mapping[str, str] | None = None) -> int:
    """An integer environment variable, or a UsageError naming the variable, the value and what is valid.

    Launchers and users set these by hand ("LOCAL_RANK=gpu0" happens); a clear one-line error beats the
    `ValueError: invalid literal for int()` traceback the seeds produced.
    """
    source = os.environ if env is None else env
    raw = source.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise UsageError(f"{name} is not set; it must be an integer >= {minimum}")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer; it must be an integer >= {minimum}") from None
    if value < minimum:
        raise UsageError(f"{name}={value} is out of range; it must be an integer >= {minimum}")
    return value


def current_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's global rank for log prefixes: RANK, else LOCAL_RANK, else 0. Never raises."""
    source = os.environ if env is None else env
    for name in ("RANK", "LOCAL_RANK"):
        raw = source.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return 0


def emit(line: str) -> None:
    """Print one whole line to stdout and flush it at once.

    One write per line, flushed, so that a supervisor reading this process's pipe gets whole lines in
    order with the training output (stderr would be a second pipe, interleaved arbitrarily).
    """
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

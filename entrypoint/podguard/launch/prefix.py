"""Per-line output prefixes: the fields each launch mode offers, and the check of a user's format.

check_format("GPU{gpu}:", PREFIX_FIELDS, "--prefix")     # UsageError (exit 64) naming a bad field
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from podguard.errors import UsageError

__all__ = [
    "DEFAULT_CPU_PREFIX",
    "DEFAULT_PREFIX",
    "PREFIX_FIELDS",
    "RANK_PREFIX_FIELDS",
    "ROLE_PREFIX_FIELDS",
    "check_format",
    "prefix_pattern",
    "prefix_rank_pattern",
]

DEFAULT_PREFIX = "GPU{gpu}:"
DEFAULT_CPU_PREFIX = "CPU{rank}:"
PREFIX_FIELDS = ("gpu", "rank", "local_rank", "name")  # per-gpu workers
ROLE_PREFIX_FIELDS = ("role", "gpu", "rank", "local_rank", "name")  # roles job files
RANK_PREFIX_FIELDS = ("rank", "local_rank", "node_rank", "gpu")  # torchrun ranks (the rank wrapper)


def check_format(fmt: str, fields: Sequence[str], what: str) -> None:
    """A prefix format may only use the documented fields; UsageError otherwise."""
    valid = ", ".join("{" + f + "}" for f in fields)
    try:
        used = [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]
    except ValueError as exc:
        raise UsageError(f"{what} {fmt!r} is not a valid format ({exc}); it may use {valid}") from None
    for name in used:
        if name not in fields:
            raise UsageError(f"{what} {fmt!r} uses unknown field {{{name}}}; it may use {valid}")
    try:
        fmt.format(**dict.fromkeys(fields, "0"))
    except (ValueError, IndexError, KeyError) as exc:
        raise UsageError(f"{what} {fmt!r} is not a valid format ({exc}); it may use {valid}") from None


def prefix_pattern(fmt: str) -> re.Pattern[str]:
    """A regex matching a line's prefix in format `fmt` (and one space after it) at the start of a line, any field
    value standing for one word: `rank{rank}:` -> `^rank\\w+: ?`. The progress watch strips it before `--progress`
    sees the line."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(fmt):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(r"[\w.-]+")
    return re.compile("^" + "".join(parts) + " ?")


def prefix_rank_pattern(fmt: str) -> re.Pattern[str] | None:
    """A regex that reads the rank out of a line's prefix in format `fmt` (group `rank`): `rank{rank}:` ->
    `^rank(?P<rank>\\d+):`, so the watch knows whose line it is; None when the format has no {rank}."""
    parts, has_rank = [], False
    for literal, name, _, _ in string.Formatter().parse(fmt):
        parts.append(re.escape(literal))
        if name == "rank" and not has_rank:
            parts.append(r"(?P<rank>\d+)")
            has_rank = True
        elif name is not None:
            parts.append(r"[\w.-]+")
    return re.compile("^" + "".join(parts)) if has_rank else None

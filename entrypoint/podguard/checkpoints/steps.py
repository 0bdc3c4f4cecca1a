"""A checkpoint's step from its name: `checkpoint-1200`, `step=1200`, `step-1200`, `step_1200`, `iter_0001200`,
`global_step1200` (docs/checkpoints.md), and `checkpoint_3`: a number the finder drops for accelerate's own automatic
naming, where it counts saves (scan.py). Pure."""

from __future__ import annotations

import re

__all__ = ["step_from_name"]

_PATTERNS = (
    re.compile(r"(?:^|[^a-z])checkpoint[-_](\d+)(?![\d])", re.IGNORECASE),  # HF; accelerate's automatic naming
    re.compile(r"global_step(\d+)(?![\d])", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])step[=_-](\d+)(?![\d])", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])iter_(\d+)(?![\d])", re.IGNORECASE),
)


def step_from_name(name: str) -> int | None:
    """The step a name carries, or None. `epoch=3-step=1200.ckpt` -> 1200; `last.ckpt` -> None."""
    for pattern in _PATTERNS:
        if (m := pattern.search(name)) is not None:
            return int(m.group(1))
    return None

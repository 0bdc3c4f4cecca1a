"""The `--checkpoints DIR` value (PODGUARD_CHECKPOINTS) as given on the command line or in the environment.

    directory = checkpoints_dir(raw)    # Path, or None when not given; UsageError (64) when empty

An empty value is what `--checkpoints $CKPT_DIR` (or `PODGUARD_CHECKPOINTS=$CKPT_DIR`) gives when the variable is
unset: it is refused, never taken as the current folder (where an unrelated `pretrained_init.pt` would become
the resume point). The option parser passes an empty variable on as "not given", so the variable is read here.
A DIR that exists and is not a folder is refused where the options are checked together (launch/config.py); a
DIR podguard may not read is not refused: each attempt warns and starts from scratch (job/handoff.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from podguard.errors import UsageError

__all__ = ["ENV_CHECKPOINTS", "checkpoints_dir"]

ENV_CHECKPOINTS = "PODGUARD_CHECKPOINTS"
_FIX = "give the folder the job writes its checkpoints to"


def checkpoints_dir(raw: object) -> Path | None:
    """The folder as given (not resolved), None when neither the option nor the variable gives one."""
    variable = os.environ.get(ENV_CHECKPOINTS)
    if raw is None:
        if variable is not None and not variable.strip():
            raise UsageError(f"{ENV_CHECKPOINTS}={variable!r} is empty (an unset variable?); {_FIX}, or unset it")
        return None
    text = str(raw)
    if not text.strip():
        if variable == text:
            raise UsageError(f"{ENV_CHECKPOINTS}={text!r} is empty (an unset variable?); {_FIX}, or unset it")
        raise UsageError(f"--checkpoints={text!r} is empty (an unset variable?); {_FIX}, or leave the option out")
    return Path(text)

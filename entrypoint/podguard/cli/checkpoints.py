"""`podguard checkpoints DIR [--json]`: what the finder sees under DIR, newest first, and which one a restart uses.

Exit 0 with or without checkpoints, and for a DIR this user may not list (a warning: a restart would start from
scratch, as `train` says before each attempt); 64 when DIR is empty, does not exist or is not a folder. Reads only
(checkpoints/).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Annotated

import typer

from podguard.checkpoints import Finding, find_checkpoints, table
from podguard.checkpoints import as_json as to_json
from podguard.cli.params import Json
from podguard.errors import UsageError

__all__ = ["checkpoints", "register"]


def register(app: typer.Typer, only: str | None = None) -> None:
    for name, func in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(func)


def checkpoints(
    directory: Annotated[str, typer.Argument(help="The folder the job writes its checkpoints to.", metavar="DIR")],
    as_json: Json = False,
) -> None:
    """List the checkpoints under DIR, newest first: layout, step, size, when written, whole or why not, and the
    one a restart would resume from (PODGUARD_RESUME_FROM)."""
    fix = "give the folder the job writes its checkpoints to"
    if not directory.strip():
        raise UsageError(f"checkpoints DIR={directory!r} is empty (an unset variable?); {fix}")
    unreadable = ""
    try:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise UsageError(f"checkpoints DIR={directory!r} is not a folder; {fix}")
        finding = find_checkpoints(directory)
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"checkpoints DIR={directory!r} does not exist; {fix}") from None
    except OSError as exc:  # a folder this user may not list: what a restart would do, as `train` says it
        unreadable = exc.strerror or type(exc).__name__
        finding = Finding(os.path.abspath(directory), ())
        print(
            f"podguard: warning: cannot read {directory} ({unreadable}): a restart would start from scratch",
            file=sys.stderr,
        )
    if as_json:
        print(json.dumps(to_json(finding, unreadable=unreadable), indent=2))
    else:
        print(table(finding, time.time(), unreadable=unreadable))


COMMANDS = {"checkpoints": checkpoints}

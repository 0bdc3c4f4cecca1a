"""`podguard checkpoints DIR [--json]`: what the finder sees under DIR, newest first, and which one a restart uses.

Exit 0 with or without checkpoints; 64 when DIR does not exist, is not a folder or cannot be listed. Reads only
(checkpoints/).
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

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
    import os

    from podguard.checkpoints import as_json as to_json
    from podguard.checkpoints import find_checkpoints, table

    if not os.path.isdir(directory):
        what = "does not exist" if not os.path.exists(directory) else "is not a folder"
        raise UsageError(f"checkpoints DIR={directory!r} {what}; give the folder the job writes its checkpoints to")
    try:
        finding = find_checkpoints(directory)
    except OSError as exc:  # e.g. a folder this user may not list
        raise UsageError(f"checkpoints DIR={directory!r} cannot be read ({exc.strerror})") from None
    if as_json:
        print(json.dumps(to_json(finding), indent=2))
    else:
        print(table(finding, time.time()))


COMMANDS = {"checkpoints": checkpoints}

"""`podguard checkpoints DIR [--store URL] [--json]`: what the finder sees under DIR, newest first, and which one
a restart uses; with `--store`, the checkpoint store's checkpoints beside them (whole or why not) and which one a
new attempt would restore.

Exit 0 with or without checkpoints, and for a DIR this user may not list (a warning: a restart would start from
scratch, as `train` says before each attempt); 64 when DIR is empty, does not exist (with --store: a DIR that does
not exist yet is a new pod's, and only the store is listed) or is not a folder, and for a store that refuses (no
bucket, credentials); 75 when the store does not answer. Reads only (checkpoints/, store/).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Annotated, Any

import typer

from podguard.checkpoints import Finding, find_checkpoints, table
from podguard.checkpoints import as_json as to_json
from podguard.cli.params import Json
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.store.backend import StoreError, StoreRefused
from podguard.store.catalog import list_stored
from podguard.store.connect import open_backend
from podguard.store.render import store_json, store_table
from podguard.store.url import parse_store_url

__all__ = ["checkpoints", "register"]


def register(app: typer.Typer, only: str | None = None) -> None:
    for name, func in COMMANDS.items():
        if only is None or name == only:
            app.command(name)(func)


def checkpoints(
    directory: Annotated[str, typer.Argument(help="The folder the job writes its checkpoints to.", metavar="DIR")],
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            envvar="PODGUARD_CHECKPOINT_STORE",
            help="Also list the checkpoint store's checkpoints (s3://BUCKET/PREFIX or file:///PATH; credentials: the "
            "standard AWS variables or files).",
            metavar="URL",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """List the checkpoints under DIR, newest first: layout, step, size, when written, whole or why not, and the
    one a restart would resume from (PODGUARD_RESUME_FROM); with --store, the store's beside them."""
    url = parse_store_url(store, "--store")
    finding, unreadable = _local(directory, allow_missing=url is not None)
    data: dict[str, Any] = to_json(finding, unreadable=unreadable) if as_json else {}
    text = table(finding, time.time(), unreadable=unreadable) if not as_json else ""
    if url is not None:
        backend = open_backend(url, attempts=3)
        try:
            backend.check()
            stored = list_stored(backend)
        except StoreRefused as exc:
            raise UsageError(f"--store={url}: {exc}") from None
        except StoreError as exc:
            raise PodguardError(f"--store={url}: {exc}", ExitCode.GPUS_BUSY) from None
        finally:
            backend.close()
        if as_json:
            data["store"] = store_json(str(url), stored, finding.chosen)
        else:
            text += "\n\n" + store_table(str(url), stored, finding.chosen, time.time())
    print(json.dumps(data, indent=2) if as_json else text)


def _local(directory: str, *, allow_missing: bool) -> tuple[Finding, str]:
    """(what the finder sees under DIR, why DIR cannot be listed: "" when it can)."""
    fix = "give the folder the job writes its checkpoints to"
    if not directory.strip():
        raise UsageError(f"checkpoints DIR={directory!r} is empty (an unset variable?); {fix}")
    if not os.path.isdir(directory):
        if allow_missing and not os.path.exists(directory):
            return Finding(os.path.abspath(directory), ()), ""
        what = "does not exist" if not os.path.exists(directory) else "is not a folder"
        raise UsageError(f"checkpoints DIR={directory!r} {what}; {fix}")
    try:
        return find_checkpoints(directory), ""
    except OSError as exc:  # a folder this user may not list: what a restart would do, as `train` says it
        unreadable = exc.strerror or type(exc).__name__
        print(
            f"podguard: warning: cannot read {directory} ({unreadable}): a restart would start from scratch",
            file=sys.stderr,
        )
        return Finding(os.path.abspath(directory), ()), unreadable


COMMANDS = {"checkpoints": checkpoints}

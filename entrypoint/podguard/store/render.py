"""How the store's checkpoints are shown by `podguard checkpoints DIR --store URL`: a table beside the local one,
or JSON. Pure: `now` is passed in.

    print(store_table(url, stored, local_newest, now))
    data = store_json(url, stored, local_newest)
"""

from __future__ import annotations

from typing import Any

from podguard.checkpoints import Checkpoint, format_size
from podguard.checkpoints.render import utc
from podguard.durations import format_duration
from podguard.store.catalog import Stored
from podguard.store.manifest import rank_key

__all__ = ["restore_choice", "store_json", "store_table"]


def restore_choice(stored: list[Stored], local: Checkpoint | None) -> Stored | None:
    """The store's checkpoint a new attempt would restore: its newest whole one, when newer than DIR's newest."""
    newest = next((s for s in stored if s.whole), None)
    if newest is None or newest.manifest is None:
        return None
    if local is not None and rank_key(local.step, local.mtime) >= newest.rank():
        return None
    return newest


def store_table(url: str, stored: list[Stored], local: Checkpoint | None, now: float) -> str:
    if not stored:
        return f"no checkpoints in the store {url}"
    chosen = restore_choice(stored, local)
    rows = [("", "NAME", "STEP", "SIZE", "WRITTEN", "WHOLE")]
    for s in stored:
        m = s.manifest
        written = f"{utc(m.written_at)} ({format_duration(max(0.0, now - m.written_at))} ago)" if m else "-"
        step = "-" if s.step is None else str(s.step)
        size = format_size(m.bytes if m is not None else s.size)
        rows.append(("*" if s is chosen else "", s.name, step, size, written, "yes" if s.whole else f"no: {s.why}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" ".join(v.ljust(w) for v, w in zip(r[:5], widths, strict=True)) + " " + r[5] for r in rows]
    lines.append(f"in the store {url}")
    if chosen is not None:
        lines.append(f"the next attempt would restore {chosen.name} from the store (*): newer than DIR's newest")
    else:
        lines.append("the next attempt would restore nothing from the store: DIR's newest is as new")
    return "\n".join(line.rstrip() for line in lines)


def store_json(url: str, stored: list[Stored], local: Checkpoint | None) -> dict[str, Any]:
    chosen = restore_choice(stored, local)
    return {
        "url": url,
        "restore": chosen.name if chosen is not None else None,
        "checkpoints": [
            {
                "name": s.name,
                "kind": "folder" if s.folder else "file",
                "step": s.step,
                "layout": s.manifest.layout if s.manifest else None,
                "size_bytes": s.manifest.bytes if s.manifest else s.size,
                "written_at": utc(s.manifest.written_at) if s.manifest else None,
                "stored_at": utc(s.manifest.stored_at) if s.manifest and s.manifest.stored_at else None,
                "whole": s.whole,
                "why_not": s.why or None,
                "restore": s is chosen,
            }
            for s in stored
        ],
    }

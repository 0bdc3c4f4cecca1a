"""How a probe child reports: exactly one JSON line on stdout and exit 0 (ok) or 1, never a traceback.

    sys.exit(one_json_line(probe, ProbeFailure, {"device": None}))

The parent (runner.py, allreduce.py) reads the last JSON line; a person reads its `error`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["one_json_line"]


def one_json_line(
    work: Callable[[], Mapping[str, Any]], failure: type[Exception], fields: Mapping[str, Any] | None = None
) -> int:
    """Run `work`; print {ok, error, ms, **fields, **its result} as one line. `failure`'s text is the error
    as it is; any other exception (a CUDA or NCCL error, a lost peer, Ctrl-C) becomes its first line."""
    started = time.monotonic()
    report: dict[str, Any] = {"ok": False, **(fields or {}), "error": None}
    try:
        report.update(work())
        report["ok"] = True
    except failure as exc:
        report["error"] = str(exc)
    except BaseException as exc:
        lines = (str(exc).strip() or type(exc).__name__).splitlines()
        report["error"] = f"{type(exc).__name__}: {lines[0][:400]}"
    report["ms"] = round((time.monotonic() - started) * 1000, 1)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0 if report["ok"] else 1

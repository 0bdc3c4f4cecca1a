"""`podguard` as a user runs it, for the end-to-end tests of jobs: a subprocess on the fake node, and job scripts.

proc = run_podguard(node, ["run", "--", sys.executable, script(tmp_path, "w.py", body)], cpu=True)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from loadfactor import scaled

PODGUARD = [sys.executable, "-m", "podguard"]


def run_podguard(node, args, *, env=None, timeout=90.0, cpu=False) -> subprocess.CompletedProcess[str]:
    """`podguard ARGS` with the node's environment; `cpu`: without the (fake) driver, so workers run on CPU.
    `timeout`: a deadline for an idle machine, stretched by the load factor (tests/loadfactor.py)."""
    full = {**node.env, **(env or {})}
    if cpu:
        full["LD_LIBRARY_PATH"] = ""
    return subprocess.run(
        [*PODGUARD, *args], env=full, capture_output=True, text=True, timeout=scaled(timeout), stdin=subprocess.DEVNULL
    )


def script(tmp_path: Path, name: str, body: str) -> str:
    """A job script (dedented) in tmp_path; its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)

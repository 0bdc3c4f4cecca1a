"""Run `run_job` as a real process, so tests can signal it like Docker would signal podguard.

usage: python tests/launch/_launch_helper.py CONFIG.json
CONFIG: {"specs": [{"name", "argv", "prefix"?, "log"?}], "grace": s, "out": path or "-" (this process's
         stdout), "result": path, "no_setpriv": bool (use the Python pdeathsig wrapper)}
Writes the outcome as JSON to "result" and exits with the job's exit code.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import podguard.launch.process as process
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec


def main() -> int:
    with open(sys.argv[1]) as fh:
        config = json.load(fh)
    if config.get("no_setpriv"):
        process._setpriv = lambda: None  # type: ignore[assignment]
    specs = [
        WorkerSpec(
            s["name"], tuple(s["argv"]), prefix=s.get("prefix", ""), log_path=Path(s["log"]) if s.get("log") else None
        )
        for s in config["specs"]
    ]
    if config["out"] == "-":
        outcome = run_job(specs, grace_s=config.get("grace", 1.0), terminal=sys.stdout.fileno())
    else:
        with open(config["out"], "wb") as out:
            outcome = run_job(specs, grace_s=config.get("grace", 1.0), terminal=out)
    with open(config["result"], "w") as fh:
        json.dump(dataclasses.asdict(outcome), fh)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())

"""The job's last word and its restarts, as lines a keeper outside the pod can read (PRODUCT.md, `pod keep`).

    podguard train: RESTART 1 of 3 in 1 s after crash (exit 1), exit 1
    podguard train: END success exit 0 after 2 attempt(s): job finished successfully in 812.4 s (8 worker(s))

Exactly one END line per `train`/`run` invocation that launched or decided anything, printed when the outcome is
known (before `--on-exit` or a guard stops the pod); a RESTART line for each relaunch. KIND is one of KINDS. A
keeper tells "a restart in progress" (RESTART, or no END yet) from "the end" (END) and the end's kind from the
word after END: `signal` is an end imposed from outside (RunPod's SIGTERM when it stops the pod), not an outcome.
"""

from __future__ import annotations

import re

__all__ = ["END_LINE", "KINDS", "end_line", "restart_line"]

KINDS = ("success", "failed", "hung", "gpu-fault", "guard", "signal", "preflight")
END_LINE = re.compile(r"^podguard (?P<command>train|run): END (?P<kind>[a-z-]+) exit (?P<code>\d+)\b")


def end_line(command: str, kind: str, code: int, attempts: int, detail: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown end kind {kind!r}; one of {', '.join(KINDS)}")
    detail = " ".join(detail.split())
    return f"podguard {command}: END {kind} exit {int(code)} after {attempts} attempt(s)" + (
        f": {detail}" if detail else ""
    )


def restart_line(command: str, number: int, total: int, delay_s: float, what: str, code: int) -> str:
    return f"podguard {command}: RESTART {number} of {total} in {delay_s:g} s after {what}, exit {int(code)}"

"""How a job's end is told to a person: one line per exit, and the summary with the root cause's last lines.

describe_exit(exit)        # 'exited with code 3' / 'was killed by SIGKILL (signal 9) — not sent by podguard...'
format_summary(outcome)    # the detail line, plus the failing worker's last log lines
"""

from __future__ import annotations

import signal

from podguard.launch.signals import signal_name
from podguard.launch.spec import JobOutcome, WorkerExit

__all__ = ["describe_exit", "format_summary", "job_detail", "signal_name"]


def describe_exit(exit: WorkerExit) -> str:
    """'exited with code 3' / 'was killed by SIGKILL (signal 9)' plus a hint where one helps."""
    if exit.signal is not None:
        text = f"was killed by {signal_name(exit.signal)} (signal {exit.signal})"
        if exit.signal == signal.SIGKILL and not exit.stopped_by_podguard:
            text += " — not sent by podguard: often the out-of-memory killer (see `dmesg`)"
        elif exit.signal == signal.SIGSEGV:
            text += " — a crash in native code"
        return text
    return f"exited with code {exit.returncode}"


def format_summary(outcome: JobOutcome, *, lines: int = 20) -> str:
    """The human summary: one line, plus the root cause's first error and last log lines when the job failed.

    The first error (the first traceback in the worker's output) leads when the last lines do not end with it:
    where a framework starts the ranks in one worker, the rank that raised first is the root cause, and the last
    lines are the other ranks failing after it (`Connection closed by peer`)."""
    text = outcome.detail or f"job exited {outcome.exit_code}"
    root = outcome.root_cause
    if outcome.exit_code == 0 or root is None:
        return text
    first = root.first_error
    tail = root.tail[-lines:]
    if first and first[-1] not in tail[-3:]:
        text += f"\nfirst error in the output of {root.name}: {first[-1].strip()}\n"
        text += "\n".join(f"  | {line}" for line in first)
        tail = tail[-max(1, lines // 2) :]
    if tail:
        text += f"\nlast {len(tail)} line(s) of {root.name}:\n" + "\n".join(f"  | {line}" for line in tail)
    return text


def job_detail(
    *,
    code: int,
    exits: tuple[WorkerExit, ...],
    elapsed_s: float,
    signum: int | None,
    root_detail: str,
) -> str:
    """The one-line account of how the job ended (the `JobOutcome.detail`), printed after `podguard: `: it does
    not start with "podguard" itself."""
    killed = [e.name for e in exits if e.stopped_by_podguard and e.signal == signal.SIGKILL]
    stopped = f"; {len(killed)} needed SIGKILL after the grace period ({', '.join(killed)})" if killed else ""
    if signum is not None:
        return (
            f"received {signal_name(signum)} after {elapsed_s:.1f} s and stopped "
            f"{len(exits)} worker(s){stopped}; exit {code}"
        )
    if root_detail:
        return f"{root_detail}; exit {code}{stopped}"
    services = [e.name for e in exits if e.stopped_by_podguard]
    then = f"; then stopped the service(s) {', '.join(services)}" if services else ""
    return f"job finished successfully in {elapsed_s:.1f} s ({len(exits)} worker(s){then})"

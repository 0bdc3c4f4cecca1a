"""Run a job: every worker at once under one supervisor, to its end.

    outcome = run_job([WorkerSpec("GPU0", ("python", "train.py"), prefix="GPU0:")], grace_s=7.0)
    sys.exit(outcome.exit_code)

Everything is checked before anything starts (unique names, runnable programs, `only` names real
workers): a mistake is a UsageError (exit 64) with nothing started.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import BinaryIO, TextIO

from podguard.errors import UsageError
from podguard.launch.printer import LineCallback
from podguard.launch.process import child_env, resolve_program
from podguard.launch.spec import JobOutcome, WorkerSpec
from podguard.launch.supervisor import DEFAULT_GRACE_S, Controller, Supervisor, Watch

__all__ = ["StartAll", "check_only", "check_specs", "run_job"]


def check_specs(specs: Sequence[WorkerSpec]) -> None:
    """Validate before anything starts: unique names, runnable programs (UsageError otherwise)."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise UsageError(f"two workers are named {spec.name!r}; worker names must be unique")
        seen.add(spec.name)
        resolve_program(spec, child_env(spec))


class StartAll(Controller):
    """Start every spec at once (a signal that arrives while starting stops the rest from starting)."""

    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.specs = specs

    def on_start(self, sup: Supervisor) -> None:
        for spec in self.specs:
            if sup.stopping:
                break
            sup.start(spec)


def check_only(specs: Sequence[WorkerSpec], only: Collection[str] | None) -> None:
    """`only` (the workers shown on the terminal) must name workers that exist."""
    if only is None:
        return
    names = {s.name for s in specs}
    unknown = sorted(set(only) - names)
    if unknown:
        raise UsageError(f"cannot show only {unknown}: no such worker; workers are {', '.join(sorted(names))}")


def run_job(
    specs: Sequence[WorkerSpec],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    terminal: BinaryIO | TextIO | int | None = None,
    only: Collection[str] | None = None,
    on_line: LineCallback | None = None,
    tail_lines: int = 20,
    summary: bool = True,
    fail_fast: bool = True,
    watch: Watch | None = None,
) -> JobOutcome:
    """Start every spec at once and supervise the job to its end (fail fast, signals, reaping).

    `out`: where prefixed lines go (default stdout); `only`: worker names shown there (all still go to
    their log files); `on_line(name, line)`: called for every line (costs a Python call per line);
    `watch`: watches the job from the loop (the billing guards).
    Raises `UsageError` (exit 64) before starting anything when a spec cannot run.
    """
    if not specs:
        raise UsageError("nothing to run: no worker was given")
    check_specs(specs)
    check_only(specs, only)
    sup = Supervisor(
        grace_s=grace_s, terminal=terminal, only=only, on_line=on_line, tail_lines=tail_lines, summary=summary,
        fail_fast=fail_fast, watch=watch,
    )  # fmt: skip
    return sup.run(StartAll(specs))

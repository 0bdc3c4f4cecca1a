"""The END line of a `train`/`run`: said once, by the conductor, around the whole run.

    end = EndOfRun("train")
    with end.around():                       # a PodguardError that escapes says END preflight (once), then goes on
        configure(...)                       # refused here: END only inside a pod (a keeper reads the pod's log)
        end.started = True                   # from here on every end says END
        end.say(Ending(EndKind.SUCCESS, 0, "job finished"))

`EndOfRun` is the one place that prints it (the format: outcome_lines.py). A refusal before the run started says
END inside a pod only (RUNPOD_POD_ID): a keeper then stops the pod rather than wait on a container that restarts
into the same refusal, while a person at a shell sees just the error. Once the run started, every end says it:
the outcome (`say`) or, when an error escapes, END preflight with the error's code and message. A command line
that Click refuses before podguard's code runs has no run: cli/app.py says that END (`refused_in_pod`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from podguard import console
from podguard.errors import PodguardError
from podguard.outcome_lines import EndKind, end_line
from podguard.pods import thispod

__all__ = ["EndOfRun", "Ending", "refused_in_pod"]


@dataclass
class Ending:
    """How the job ended, before `--on-exit`: the END line's kind and code, the record to point at."""

    kind: EndKind
    code: int
    detail: str
    record: Path | None = None


class EndOfRun:
    """The one END line of one `train`/`run` (see the module docstring)."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.started = False  # the run began (after its configuration was accepted)
        self.attempts = 0
        self.said: EndKind | None = None

    def say(self, kind: EndKind, code: int, detail: str = "") -> None:
        """Print the END line; a second one is a bug (exactly one per run)."""
        if self.said is not None:
            raise AssertionError(f"END said twice: {self.said} then {kind}")
        self.said = kind
        console.line(end_line(self.command, kind, code, self.attempts, detail), loud=True)

    @contextmanager
    def around(self) -> Iterator[EndOfRun]:
        """A PodguardError that escapes the run says END preflight (when no END was said yet), then propagates."""
        try:
            yield self
        except PodguardError as exc:
            if self.said is None and (self.started or in_pod()):
                self.say(EndKind.PREFLIGHT, exc.code, exc.message)
            raise


def in_pod() -> bool:
    return bool(thispod.pod_id())


def refused_in_pod(command: str, code: int, message: str) -> None:
    """A `train`/`run` command line refused before the conductor ran (Click's parse): END preflight, in a pod."""
    if in_pod():
        console.line(end_line(command, EndKind.PREFLIGHT, code, 0, message), loud=True)

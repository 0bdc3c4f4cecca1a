"""`--checkpoints DIR` around each attempt: before it, the newest whole checkpoint handed to the job; after it,
the newest one at its end and whether the attempt wrote a new one (progress, for the crash-loop rule).

    handoff = Handoff(Path("/workspace/ckpt"))
    env = handoff.before()          # PODGUARD_CHECKPOINTS, PODGUARD_RESUME_FROM/_STEP; says `resuming from ...`
    seen = handoff.after()          # AttemptCheckpoints(started, newest, saved); seen.fragment() for END and RESTART

Reads DIR only (checkpoints/); a DIR that does not exist yet is "no checkpoint yet"; one podguard may not list is
a warning before each attempt, which starts from scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.checkpoints import (
    ENV_RESUME_FROM,
    ENV_RESUME_STEP,
    Checkpoint,
    Finding,
    Key,
    end_fragment,
    find_checkpoints,
    resume_env,
    resume_lines,
)
from podguard.checkpoints.option import ENV_CHECKPOINTS  # the workers get DIR too (the Lightning callback saves there)
from podguard.checkpoints.render import utc

if TYPE_CHECKING:
    from podguard.job.store import StoreSync

__all__ = ["ENV_CHECKPOINTS", "AttemptCheckpoints", "Handoff"]


@dataclass(frozen=True)
class AttemptCheckpoints:
    started: Checkpoint | None  # what the attempt was handed (None: from scratch)
    newest: Checkpoint | None  # the newest whole one at its end
    saved: bool  # a whole checkpoint appeared (or changed) during the attempt

    def fragment(self) -> str:
        return end_fragment(self.started, self.newest)

    def record(self) -> dict[str, object]:
        def one(c: Checkpoint | None) -> dict[str, object] | None:
            return None if c is None else {"path": c.path, "step": c.step, "written_at": utc(c.mtime)}

        return {"started_from": one(self.started), "newest_at_end": one(self.newest), "saved": self.saved}


class Handoff:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(os.path.abspath(directory))
        self._started: Checkpoint | None = None
        self._listed_before: frozenset[Key] = frozenset()
        self.store: StoreSync | None = None  # --checkpoint-store (job/store.py)

    def find(self, *, skip: frozenset[Key] = frozenset()) -> Finding:
        """Newest first until the first whole one (only what is not in `skip`); none when DIR cannot be listed."""
        return self._find(skip)[0]

    def _find(self, skip: frozenset[Key]) -> tuple[Finding, str]:
        """(the finding, why DIR cannot be listed: "" when it can, or when it does not exist yet)."""
        try:
            return find_checkpoints(self.directory, until_whole=True, skip=skip), ""
        except FileNotFoundError:  # not there yet: the job creates it with its first save
            return Finding(str(self.directory), ()), ""
        except OSError as exc:  # e.g. a folder this user may not list: nothing podguard can hand over
            return Finding(str(self.directory), ()), exc.strerror or type(exc).__name__

    def before(self) -> dict[str, str]:
        finding, unreadable = self._find(frozenset())
        if unreadable:  # never 64: the job may still save there (another user's folder, a volume mounted later)
            console.warn(f"cannot read --checkpoints {self.directory} ({unreadable}): starting from scratch")
        else:
            if self.store is not None:  # a newer whole checkpoint in the store is restored into DIR first
                finding = self.store.restore(finding, self.find)
            for line in resume_lines(finding, time.time()):
                console.say(line)
        self._started = finding.chosen
        self._listed_before = finding.keys
        for name in (ENV_RESUME_FROM, ENV_RESUME_STEP):  # unset unless handed over (the workers inherit ours)
            os.environ.pop(name, None)
        return {ENV_CHECKPOINTS: str(self.directory), **resume_env(finding)}

    def after(self, run_dir: Path | None = None) -> AttemptCheckpoints:
        finding = self.find()
        saved = self.find(skip=self._listed_before).chosen is not None  # a whole one that is new (or changed)
        seen = AttemptCheckpoints(self._started, finding.chosen, saved)
        if run_dir is not None:
            with contextlib.suppress(OSError):  # best-effort, like the run's other records
                (run_dir / "checkpoints.json").write_text(json.dumps(seen.record(), indent=2) + "\n")
        return seen

"""Save before a billing guard stops the job: `--save-signal` to every worker, then up to `--save-grace` for a
new whole checkpoint under `--checkpoints` (or the workers' exit); then the job is ended as before.

    save = SaveBeforeStop(SaveSettings(signal.SIGUSR1, 120.0, Path("/workspace/ckpt")), hung=lambda: False)
    save.start(sup, done=lambda note: ...)    # False: not asked (a hung job cannot save; nobody to signal)
    save.finish()                             # the workers ended on their own: the note, said once

Who gets the signal: each worker process (the user's command); in torchrun mode each rank, the child of its
podguard rank wrapper (torchrun itself would die of SIGUSR1; the process group would take the ranks' data loader
workers along, which SIGUSR1 kills). A new checkpoint counts
once it is whole and unchanged over two polls (its files no longer growing). The finder only reads DIR.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.durations import format_duration

if TYPE_CHECKING:
    from podguard.checkpoints import Checkpoint
    from podguard.launch.loop import Timer
    from podguard.launch.supervisor import Supervisor

__all__ = ["POLL_S", "SaveBeforeStop", "SaveSettings", "whole_keys"]

POLL_S = 0.5


@dataclass(frozen=True)
class SaveSettings:
    signum: int
    grace_s: float
    directory: Path
    torchrun: bool = False  # signal torchrun's children, not torchrun


def whole_keys(directory: Path) -> dict[tuple[str, float, int], Checkpoint]:
    """The whole checkpoints under `directory` by (path, mtime, size); {} when it does not exist (yet)."""
    from podguard.checkpoints import find_checkpoints

    try:
        finding = find_checkpoints(directory)
    except OSError:
        return {}
    return {(c.path, c.mtime, c.size): c for c in finding.checkpoints if c.whole}


class SaveBeforeStop:
    def __init__(self, settings: SaveSettings, hung: Callable[[], bool]) -> None:
        self.settings = settings
        self.hung = hung
        self.note: str | None = None  # what happened, once decided
        self._sup: Supervisor | None = None
        self._done: Callable[[str], None] | None = None
        self._before: dict[tuple[str, float, int], Checkpoint] = {}
        self._candidate: tuple[str, float, int] | None = None
        self._started = 0.0
        self._timer: Timer | None = None

    @property
    def waiting(self) -> bool:
        return self._done is not None and self.note is None

    def start(self, sup: Supervisor, done: Callable[[str], None]) -> bool:
        """Ask the workers to save and poll for the checkpoint; `done(note)` when saved or the grace is over.
        False (nothing asked) when the job is hung or no worker is left to ask."""
        s = self.settings
        name = signal.Signals(s.signum).name
        if self.hung():
            self.note = f"no save request ({name}): the job is hung and cannot save"
            return False
        self._before = whole_keys(s.directory)
        sent = self._signal_workers(sup)
        if not sent:
            return False
        self._sup, self._done, self._started = sup, done, time.monotonic()
        sup.message(
            f"asking the job to save before it is stopped: {name} to {sent} process(es); waiting up to "
            f"{format_duration(s.grace_s)} for a new whole checkpoint in {s.directory}"
        )
        self._timer = sup.call_later(POLL_S, self._poll)
        return True

    def _signal_workers(self, sup: Supervisor) -> int:
        sent = 0
        for worker in sup.workers.values():
            if not worker.alive:
                continue
            targets = _ranks_of(worker.pid) if self.settings.torchrun else [worker.pid]
            for pid in targets:
                try:
                    os.kill(pid, self.settings.signum)
                    sent += 1
                except (ProcessLookupError, PermissionError):
                    continue
        return sent

    def _poll(self) -> None:
        sup = self._sup
        if sup is None or self.note is not None:
            return
        saved = self._new_checkpoint()
        elapsed = time.monotonic() - self._started
        if saved is not None:
            self._decide(f"saved {saved} in {format_duration(elapsed)}")
        elif sup.stopping:
            self.finish()
        elif elapsed >= self.settings.grace_s:
            self._decide(f"no new whole checkpoint within the {format_duration(self.settings.grace_s)} save grace")
        else:
            self._timer = sup.call_later(min(POLL_S, max(0.0, self.settings.grace_s - elapsed)), self._poll)

    def _new_checkpoint(self) -> str | None:
        """The newest checkpoint that is whole now, was not before, and did not change since the last poll."""
        fresh = {k: c for k, c in whole_keys(self.settings.directory).items() if k not in self._before}
        if not fresh:
            self._candidate = None
            return None
        key = max(fresh, key=lambda k: (fresh[k].step if fresh[k].step is not None else -1, k[1]))
        if key != self._candidate:
            self._candidate = key
            return None
        c = fresh[key]
        return f"checkpoint {c.path}" + (f" (step {c.step})" if c.step is not None else "")

    def _decide(self, note: str) -> None:
        self.note = note
        done, self._done = self._done, None
        if done is not None:
            done(note)

    def finish(self) -> None:
        """The job ended before a decision (the workers exited after saving, or another failure stopped it)."""
        if not self.waiting:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._candidate = None
        fresh = [c for k, c in whole_keys(self.settings.directory).items() if k not in self._before]
        if fresh:
            c = max(fresh, key=lambda c: (c.step if c.step is not None else -1, c.mtime))
            step = f" (step {c.step})" if c.step is not None else ""
            self.note = f"saved checkpoint {c.path}{step}; the workers exited"
        else:
            self.note = "the workers exited without a new whole checkpoint"
        self._done = None


def _ranks_of(torchrun_pid: int) -> list[int]:
    """torchrun's ranks: the children of its rank wrappers (python -m podguard.rank.wrap), else its children."""
    from podguard.procfs import children_of, read_bytes

    ranks = []
    for child in children_of(torchrun_pid):
        try:
            cmdline = read_bytes(f"/proc/{child}/cmdline")
        except OSError:  # it just ended
            continue
        ranks.extend(children_of(child) if b"podguard.rank.wrap" in cmdline else [child])
    return ranks

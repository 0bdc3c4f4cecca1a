"""Save before a billing guard stops the job: `--save-signal` to every worker, then up to `--save-grace` for a
new whole checkpoint under `--checkpoints` (or the workers' exit); then the job is ended as before.

    save = SaveBeforeStop(SaveSettings(signal.SIGUSR1, 120.0, Path("/workspace/ckpt")), hung=lambda: False,
                          clock=runtime_watch)  # its hang clock stands still while podguard waits for the save
    save.start(sup, done=lambda note: ...)    # False: not asked (a hung job cannot save; nobody to signal)
    save.finish()                             # the workers ended on their own: the note, said once

Who gets the signal: the training processes of each worker (guards/targets.py): the worker itself, or below a
shell or a launcher (`bash train.sh`, `accelerate launch`, torchrun and podguard's rank wrappers, which SIGUSR1
would kill) the processes it runs, and below `torch.multiprocessing.spawn`'s parent (no handler of its own) the
ranks that have one; never a process group (the data loader workers die of SIGUSR1). A new
checkpoint counts once it is whole and unchanged over two polls (its files no longer growing). The finder only
reads DIR.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from podguard import console
from podguard.checkpoints import find_checkpoints, list_keys
from podguard.durations import format_duration
from podguard.guards.targets import catches, save_targets

if TYPE_CHECKING:
    from podguard.checkpoints import Checkpoint, Key
    from podguard.launch.loop import Timer
    from podguard.launch.supervisor import Supervisor

__all__ = ["POLL_S", "HangClock", "SaveBeforeStop", "SaveSettings", "listed_keys", "newest_new"]

POLL_S = 0.5


class UploadWait(Protocol):
    """The checkpoint store's side of the save before a stop (job/store.py makes one with --checkpoint-store)."""

    def note(self, checkpoint: Checkpoint, out_of_time: bool) -> str | None:
        """None while the saved checkpoint's upload may still come; else a line on whether it reached the store."""
        ...


class HangClock(Protocol):
    """The hang watch's clock (launch/watch/runtime.py): it stands still while podguard waits for a save it asked
    for (a save may be silent for minutes), at most the save grace."""

    def hold_clock(self, max_s: float) -> None: ...

    def release_clock(self) -> None: ...


@dataclass(frozen=True)
class SaveSettings:
    signum: int
    grace_s: float
    directory: Path


def listed_keys(directory: Path) -> frozenset[Key]:
    """The checkpoints under `directory` as listed (none judged); empty when it does not exist (yet)."""
    try:
        return list_keys(directory)
    except OSError:
        return frozenset()


def newest_new(directory: Path, before: frozenset[Key]) -> Checkpoint | None:
    """The newest whole checkpoint not listed in `before` (only those are judged: a poll stays cheap)."""
    try:
        return find_checkpoints(directory, until_whole=True, skip=before).chosen
    except OSError:
        return None


class SaveBeforeStop:
    def __init__(self, settings: SaveSettings, hung: Callable[[], bool], clock: HangClock | None = None) -> None:
        self.settings = settings
        self.hung = hung
        self.clock = clock
        self.note: str | None = None  # what happened, once decided
        self._sup: Supervisor | None = None
        self._done: Callable[[str], None] | None = None
        self._before: frozenset[Key] = frozenset()
        self._candidate: Key | None = None
        self._started = 0.0
        self._timer: Timer | None = None
        self.store: UploadWait | None = None  # --checkpoint-store: the saved checkpoint's upload too (job/store.py)
        self._saved: Checkpoint | None = None
        self._handled = False  # a process the signal was sent to had a handler for it

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
        self._before = listed_keys(s.directory)
        sent = self._signal_workers(sup)
        if not sent:  # (a launcher that has not started its ranks yet, or workers that just ended)
            self.note = f"no save request ({name}): no training process to ask"
            return False
        self._sup, self._done, self._started = sup, done, time.monotonic()
        console.say(
            f"asking the job to save before it is stopped: {name} to {sent} process(es); waiting up to "
            f"{format_duration(s.grace_s)} for a new whole checkpoint in {s.directory}"
        )
        self._timer = sup.call_later(POLL_S, self._poll)
        if self.clock is not None:
            self.clock.hold_clock(s.grace_s)
        return True

    def _signal_workers(self, sup: Supervisor) -> int:
        sent = 0
        for worker in sup.workers.values():
            if not worker.alive:
                continue
            for pid in save_targets(worker.pid, self.settings.signum):
                self._handled = self._handled or bool(catches(pid, self.settings.signum))
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
        if saved is not None and self.store is not None and self._saved is not None:
            stored = self.store.note(self._saved, elapsed >= self.settings.grace_s)
            if stored is None:  # its upload may still come within the grace: look again
                self._timer = sup.call_later(POLL_S, self._poll)
                return
            saved = f"{saved} in {format_duration(elapsed)}; {stored}"
        elif saved is not None:
            saved = f"{saved} in {format_duration(elapsed)}"
        if saved is not None:
            self._decide(f"saved {saved}")
        elif sup.stopping:
            self.finish()
        elif elapsed >= self.settings.grace_s:
            self._decide(f"no new whole checkpoint within the {format_duration(self.settings.grace_s)} save grace")
        else:
            self._timer = sup.call_later(min(POLL_S, max(0.0, self.settings.grace_s - elapsed)), self._poll)

    def _new_checkpoint(self) -> str | None:
        """The newest checkpoint that is whole now, was not before, and did not change since the last poll."""
        c = newest_new(self.settings.directory, self._before)
        if c is None:
            self._candidate = None
            return None
        if c.key != self._candidate:
            self._candidate = c.key
            return None
        self._saved = c
        return f"checkpoint {c.path}" + (f" (step {c.step})" if c.step is not None else "")

    def _decide(self, note: str) -> None:
        self._release()
        self.note = note
        done, self._done = self._done, None
        if done is not None:
            done(note)

    def finish(self) -> None:
        """The job ended before a decision (the workers exited after saving, or another failure stopped it)."""
        if not self.waiting:
            return
        self._release()
        if self._timer is not None:
            self._timer.cancel()
        self._candidate = None
        c = newest_new(self.settings.directory, self._before)
        name = signal.Signals(self.settings.signum).name
        if c is not None:
            step = f" (step {c.step})" if c.step is not None else ""
            self.note = f"saved checkpoint {c.path}{step}; the workers exited"
        elif self._killed_by_the_signal() and not self._handled:  # (never blamed when the processes had one)
            self.note = (
                f"the job died of {name} without saving: it has no handler for the save signal (install one: "
                "docs/checkpoints.md), or drop --save-signal"
            )
        else:
            self.note = "the workers exited without a new whole checkpoint"
        self._done = None

    def _release(self) -> None:
        if self.clock is not None:
            self.clock.release_clock()

    def _killed_by_the_signal(self) -> bool:
        """A worker ended by the save signal itself (its default action), or a shell whose child was (128+N)."""
        signum = self.settings.signum
        workers = self._sup.workers.values() if self._sup is not None else ()
        codes = [os.waitstatus_to_exitcode(w.status) for w in workers if w.status is not None]
        return any(code in (-signum, 128 + signum) for code in codes)

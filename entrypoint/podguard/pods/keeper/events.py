"""How the keeper tells what happens: a line on the terminal, a record in the state dir, a webhook post.

    events = Events(name, store, progress, notifier=None)
    events.say("recovery", "EXITED without an outcome: starting it (recovery 1 of 5)", notify=True, pod=pod.id)
    events.watching("pod llm-train (abc): RUNNING, job running, last line 4s ago")   # progress while it waits

Every event is one `podguard: keep NAME: ...` line on stderr and one JSON line in
`<state dir>/keep/NAME.events.jsonl`; recoveries, the end and a give-up also go to `--notify`. While nothing
happens the progress line is rewritten in place on a terminal, and printed only when it changes in a log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from podguard.pods.keeper.notify import Notifier
from podguard.pods.keeper.record import KeepStore
from podguard.redact import redact_text

__all__ = ["Events"]


class Events:
    def __init__(
        self,
        name: str,
        store: KeepStore,
        *,
        notifier: Notifier | None = None,
        out: TextIO | None = None,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.name = name
        self._scrub = scrub  # the API key out of anything shown or kept (a pod's line may echo it)
        self.store = store
        self.notifier = notifier
        self._out = out if out is not None else sys.stderr
        self._tty = bool(getattr(self._out, "isatty", lambda: False)())
        self._open_line = False
        self._shown = ""
        self.started = time.monotonic()

    def say(self, kind: str, text: str, *, notify: bool = False, **fields: Any) -> dict[str, Any]:
        """One event: the terminal line, the record, and (notify) the webhook."""
        self._end_line()
        text = self._scrub(text)
        line = redact_text(f"keep {self.name}: {text}")
        print(f"podguard: {line}", file=self._out, flush=True)
        entry = self.store.event(
            kind, text, **{k: self._scrub(v) if isinstance(v, str) else v for k, v in fields.items()}
        )
        if notify and self.notifier is not None:
            self.notifier.send(f"podguard {line}")
        return entry

    def note(self, text: str) -> None:
        """A line for the terminal only (steps of an action already recorded as an event)."""
        self._end_line()
        print(f"podguard: keep {self.name}: {redact_text(self._scrub(text))}", file=self._out, flush=True)

    def watching(self, text: str, live: str = "") -> None:
        """Progress while nothing happens: rewritten in place on a terminal (with `live`, e.g. "last line 4s
        ago"); in a log only when `text` changes."""
        shown = f"podguard: keep {self.name}: {redact_text(self._scrub(text))}"
        if self._tty:
            elapsed = time.monotonic() - self.started
            extra = f", {live}" if live else ""
            print(f"\r\x1b[K{shown}{extra} [{elapsed:.0f}s]", end="", file=self._out, flush=True)
            self._open_line = True
        elif shown != self._shown:
            print(shown, file=self._out, flush=True)
        self._shown = shown

    def _end_line(self) -> None:
        if self._open_line:
            print(file=self._out, flush=True)
            self._open_line = False

    def close(self) -> None:
        self._end_line()
        if self.notifier is not None:
            self.notifier.close()

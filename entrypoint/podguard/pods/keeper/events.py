"""How the keeper tells what happens: a line on the console, a record in the state dir, a webhook post.

    with console.tagged("keep llm-train"):       # keeper/command.py: every line of the keeper carries its name
        events = Events(name, store, notifier=None)
        events.say("recovery", "EXITED without an outcome: starting it (recovery 1 of 5)", notify=True, pod=pod.id)
        events.watching("pod llm-train (abc): RUNNING, job running", "last line 4s ago")   # while it waits

Every event is one console line (`podguard: keep NAME: ...` on stderr, under the keeper's tag) and one JSON line
in `<state dir>/keep/NAME.events.jsonl`; recoveries, the end and a give-up also go to `--notify`. While nothing
happens the watch line is a console status: rewritten in place on a terminal (with a clock), printed only when it
changes in a log. Steps that are not events (a note, a wait) are plain `console.say` lines of the keeper.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from podguard import console
from podguard.pods.keeper.notify import Notifier
from podguard.pods.keeper.record import KeepStore
from podguard.redact import redact_text

__all__ = ["FINAL", "Events"]

FINAL = ("end", "gave-up", "refused")  # the last word: posted at once, and waited for first on close


class Events:
    def __init__(
        self,
        name: str,
        store: KeepStore,
        *,
        notifier: Notifier | None = None,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.name = name
        self._scrub = scrub  # the API key out of what is kept and posted (a pod's line may echo it)
        self.store = store
        self.notifier = notifier
        self._started = time.monotonic()  # what the watch line's clock counts from

    def say(self, kind: str, text: str, *, notify: bool = False, **fields: Any) -> dict[str, Any]:
        """One event: the console line, the record, and (notify) the webhook."""
        text = self._scrub(text)
        console.say(text)
        entry = self.store.event(
            kind, text, **{k: self._scrub(v) if isinstance(v, str) else v for k, v in fields.items()}
        )
        if notify and self.notifier is not None:
            self.notifier.send(f"podguard {redact_text(f'keep {self.name}: {text}')}", final=kind in FINAL)
        return entry

    def watching(self, text: str, live: str = "") -> None:
        """While nothing happens: a console status, rewritten in place on a terminal (with `live`, e.g. "last line
        4s ago", and the keeper's clock); in a log only when `text` changes."""
        extra = f", {live}" if live else ""
        console.status(("keep", self.name, text), text, live=f"{text}{extra} [{time.monotonic() - self._started:.0f}s]")

    def close(self) -> None:
        console.settle()
        if self.notifier is not None:
            self.notifier.close()

"""How the keeper tells what happens: a line on the terminal, a record in the state dir, a webhook post.

    events = Events(name, store, notifier=None)
    events.say("recovery", "EXITED without an outcome: starting it (recovery 1 of 5)", notify=True, pod=pod.id)
    events.watching("pod llm-train (abc): RUNNING, job running, last line 4s ago")   # progress while it waits

Every event is one `podguard: keep NAME: ...` line on stderr and one JSON line in
`<state dir>/keep/NAME.events.jsonl`; recoveries, the end and a give-up also go to `--notify`. While nothing
happens the progress line is rewritten in place on a terminal, and printed only when it changes in a log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from podguard.pods.keeper.notify import Notifier
from podguard.pods.keeper.record import KeepStore
from podguard.pods.status_lines import Progress
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
        out: TextIO | None = None,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.name = name
        self._scrub = scrub  # the API key out of anything shown or kept (a pod's line may echo it)
        self.store = store
        self.notifier = notifier
        self._progress = Progress(out)

    def say(self, kind: str, text: str, *, notify: bool = False, **fields: Any) -> dict[str, Any]:
        """One event: the terminal line, the record, and (notify) the webhook."""
        text = self._scrub(text)
        line = redact_text(f"keep {self.name}: {text}")
        self._progress.say(line)
        entry = self.store.event(
            kind, text, **{k: self._scrub(v) if isinstance(v, str) else v for k, v in fields.items()}
        )
        if notify and self.notifier is not None:
            self.notifier.send(f"podguard {line}", final=kind in FINAL)
        return entry

    def note(self, text: str) -> None:
        """A line for the terminal only (steps of an action already recorded as an event)."""
        self._progress.say(f"keep {self.name}: {self._scrub(text)}")

    def watching(self, text: str, live: str = "") -> None:
        """Progress while nothing happens: rewritten in place on a terminal (with `live`, e.g. "last line 4s
        ago"); in a log only when `text` changes."""
        shown = f"podguard: keep {self.name}: {redact_text(self._scrub(text))}"
        extra = f", {live}" if live else ""
        clock = f"{shown}{extra} [{self._progress.elapsed_s:.0f}s]"
        self._progress.live(shown, shown, on_terminal=clock)

    def close(self) -> None:
        self._progress.close()
        if self.notifier is not None:
            self.notifier.close()

"""`--notify URL`: one JSON POST per recovery, end and give-up, that Slack and Discord webhooks both take.

    check_notify_url("https://hooks.slack.com/services/T/B/X")      # UsageError (64) for anything else
    notifier = Notifier(url, scrub=key.scrub)
    notifier.send("podguard keep llm-train: ...")                   # in the background; never raises
    notifier.send("... the job succeeded ...", final=True)          # at once, not behind a slow queue
    notifier.close()                                                # the final message first, then the queue

The body is `{"text": ..., "content": ...}` (Slack reads `text`, Discord `content`; each ignores the other).
The text is scrubbed of the API key and of token-like strings before it leaves. A webhook that fails is one
console warning (naming the host, not the URL: the URL itself is a secret); each message has a deadline of its own
(two tries within DEADLINE_S, 5 s), so a webhook that never answers costs seconds, and never stops the keeper.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from podguard import console
from podguard.errors import UsageError
from podguard.redact import redact_text

__all__ = ["Notifier", "check_notify_url", "is_secret_reference", "webhook_body"]

TRIES = 2
DEADLINE_S = 5.0  # one message, all its tries together (PODGUARD_KEEP_NOTIFY_S)
_SECRET_REF = "{{ RUNPOD_SECRET_"


def is_secret_reference(value: str) -> bool:
    """A RunPod secret reference (`{{ RUNPOD_SECRET_name }}`): RunPod fills it in inside the pod."""
    text = value.strip()
    return text.startswith(_SECRET_REF) and text.endswith("}}")


def check_notify_url(url: str, *, deployed: bool = False) -> str:
    """An http(s) URL with a host; with --deploy also a RunPod secret reference. UsageError otherwise."""
    if deployed and is_secret_reference(url):
        return url.strip()
    bad = UsageError(
        f"--notify {_shown(url)!r} is not valid; expected an http(s) webhook URL (Slack, Discord or any that takes "
        "JSON)" + (", or a RunPod secret reference like {{ RUNPOD_SECRET_slack_hook }}" if deployed else "")
    )
    try:
        parts = urlsplit(url.strip())
        _ = parts.port
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url.strip()):
        raise bad
    return url.strip()


def _shown(url: str) -> str:
    """Enough of a URL to recognise it: its scheme and host, never its user:password part or its secret path.
    Never raises (it names a URL that failed to parse)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unparsable URL)"
    if parts.scheme and host:
        return f"{parts.scheme}://{host}{port}/..."
    return "(a URL without a scheme and host)"


def webhook_body(text: str) -> bytes:
    return json.dumps({"text": text, "content": text}).encode()


class Notifier:
    """Posts in the background, one message at a time, each within `deadline_s` (all its tries together).

    A final message (the end, a give-up, a refusal) does not queue behind the others: it is posted at once on a
    thread of its own, and `close()` waits for it first; what is still queued behind a slow webhook then gets
    what is left of one deadline, and is dropped with a warning after that."""

    def __init__(self, url: str, *, scrub: Callable[[str], str], deadline_s: float = DEADLINE_S) -> None:
        self._url = url
        self._scrub = scrub
        self._deadline_s = deadline_s
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._finals: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="podguard-notify", daemon=True)
        self._thread.start()

    def send(self, text: str, *, final: bool = False) -> None:
        clean = redact_text(self._scrub(text))
        if not final:
            self._queue.put(clean)
            return
        thread = threading.Thread(target=self._post, args=(clean,), name="podguard-notify-final", daemon=True)
        self._finals.append(thread)
        thread.start()

    def close(self) -> None:
        deadline = time.monotonic() + self._deadline_s + 0.5
        for thread in self._finals:  # the end or give-up message first, whatever the queue is stuck on
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._queue.put(None)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = self._queue.qsize() - 1
        if self._thread.is_alive() and left > 0:
            console.warn(f"{left} --notify message(s) to {_shown(self._url)} not sent (the webhook is slow)")

    def _run(self) -> None:
        while True:
            text = self._queue.get()
            if text is None:
                return
            self._post(text)

    def _post(self, text: str) -> None:
        """Two tries within the message's deadline. urlopen's timeout bounds each socket read, not the whole post
        (a webhook that answers a byte at a time, a slow name lookup): each try runs on a thread of its own and is
        given up once the deadline passes."""
        error = "no time left"
        deadline = time.monotonic() + self._deadline_s
        for _ in range(TRIES):
            left = deadline - time.monotonic()
            if left < 0.1:
                break
            outcome: list[str] = []
            attempt = threading.Thread(target=self._try, args=(text, left, outcome), name="podguard-notify-try")
            attempt.daemon = True
            attempt.start()
            attempt.join(timeout=left)
            if not outcome:
                error = f"no answer within {self._deadline_s:g} s"
                break
            if outcome[0] == "":
                return
            error = outcome[0]
        console.warn(f"--notify to {_shown(self._url)} failed ({error}); the keeper goes on")

    def _try(self, text: str, timeout: float, outcome: list[str]) -> None:
        """One POST; appends "" when the webhook answered, else what went wrong."""
        request = urllib.request.Request(
            self._url,
            data=webhook_body(text),
            headers={"Content-Type": "application/json", "User-Agent": "podguard-keep"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
            outcome.append("")
        except Exception as exc:  # a webhook must never stop the keeper
            outcome.append(type(exc).__name__ + (f" {exc.code}" if hasattr(exc, "code") else ""))

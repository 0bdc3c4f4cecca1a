"""`--notify URL`: one JSON POST per recovery, end and give-up, that Slack and Discord webhooks both take.

    check_notify_url("https://hooks.slack.com/services/T/B/X")      # UsageError (64) for anything else
    notifier = Notifier(url, scrub=key.scrub)
    notifier.send("podguard keep llm-train: ...")                   # in the background; never raises
    notifier.close()                                                # waits briefly for what is queued

The body is `{"text": ..., "content": ...}` (Slack reads `text`, Discord `content`; each ignores the other).
The text is scrubbed of the API key and of token-like strings before it leaves. A webhook that fails is one
warning line (naming the host, not the URL: the URL itself is a secret) and two tries; it never stops the keeper.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from podguard.errors import UsageError
from podguard.redact import redact_text

__all__ = ["Notifier", "check_notify_url", "is_secret_reference", "webhook_body"]

TRIES = 2
TIMEOUT_S = 10.0
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
    def __init__(self, url: str, *, scrub: Callable[[str], str], warn: Callable[[str], None]) -> None:
        self._url = url
        self._scrub = scrub
        self._warn = warn
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="podguard-notify", daemon=True)
        self._thread.start()

    def send(self, text: str) -> None:
        self._queue.put(redact_text(self._scrub(text)))

    def close(self, wait_s: float = TIMEOUT_S * TRIES) -> None:
        self._queue.put(None)
        self._thread.join(timeout=wait_s)

    def _run(self) -> None:
        while True:
            text = self._queue.get()
            if text is None:
                return
            self._post(text)

    def _post(self, text: str) -> None:
        request = urllib.request.Request(
            self._url,
            data=webhook_body(text),
            headers={"Content-Type": "application/json", "User-Agent": "podguard-keep"},
            method="POST",
        )
        error = ""
        for _ in range(TRIES):
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                    answer.read()
                return
            except Exception as exc:  # a webhook must never stop the keeper
                error = type(exc).__name__ + (f" {exc.code}" if hasattr(exc, "code") else "")
        self._warn(f"warning: --notify to {_shown(self._url)} failed ({error}); the keeper goes on")

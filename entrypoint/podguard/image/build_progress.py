"""Show a build as it happens: the context upload, each Dockerfile step with its start time, RUN output,
base-image pulls (one line per layer and status, not every progress tick), and the error that ended it.

    printer = BuildPrinter()            # the build's transcript: console lines as they are (stderr)
    for event in client.api.build(..., decode=True):
        printer.event(event)            # raises PodguardError on a build error
    printer.image_id                     # "sha256:..." once the engine reported it
"""

from __future__ import annotations

import time
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError
from podguard.units import MIB

__all__ = ["BuildPrinter"]


class BuildPrinter:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.image_id: str | None = None
        self.steps = 0
        self.cached_steps = 0
        self._pull_seen: set[tuple[str, str]] = set()
        self._upload_decile = -1

    def _elapsed(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s]"

    def upload(self, sent: int, total: int) -> None:
        """Context upload progress, one line per 10 %."""
        decile = 10 if total <= 0 else min(10, sent * 10 // total)
        if decile > self._upload_decile:
            self._upload_decile = decile
            console.line(f"{self._elapsed()} sending the build context: {sent / MIB:.0f} of {total / MIB:.0f} MiB")

    def event(self, event: dict[str, Any]) -> None:
        if "error" in event:
            detail = (event.get("errorDetail") or {}).get("message") or event["error"]
            raise PodguardError(f"the image build failed: {str(detail).strip()}", ExitCode.FAILURE)
        aux = event.get("aux")
        if isinstance(aux, dict) and "ID" in aux:
            self.image_id = aux["ID"]
        if "stream" in event:
            self._stream(str(event["stream"]))
        elif "status" in event:
            self._status(event)

    def _stream(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith("Step "):
                self.steps += 1
                line = f"{self._elapsed()} {line}"
            elif line.strip() == "---> Using cache":
                self.cached_steps += 1
            if line.strip():
                console.line(line)

    def _status(self, event: dict[str, Any]) -> None:
        status, layer = str(event["status"]), str(event.get("id", ""))
        if (layer, status) in self._pull_seen:
            return  # a progress tick of a layer already announced in this state
        self._pull_seen.add((layer, status))
        console.line(f"{self._elapsed()} {layer + ': ' if layer else ''}{status}")

"""Server-Sent Events parsing (the WHATWG event-stream format), independent of any HTTP library.

    for event in parse_sse(iter(response.readline, b"")):
        print(event.id, event.data)

Comment lines (`: keep-alive`) are skipped; multi-line `data:` fields are joined with newlines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["SseEvent", "parse_sse"]


@dataclass(frozen=True)
class SseEvent:
    data: str
    id: str = ""
    event: str = "message"


def parse_sse(lines: Iterable[bytes]) -> Iterator[SseEvent]:
    """Events from raw lines (each ending in LF or CRLF), dispatched at each blank line."""
    data: list[str] = []
    event_id = ""
    event_type = ""
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield SseEvent("\n".join(data), event_id, event_type or "message")
            data, event_type = [], ""
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            event_id = value
        elif name == "event":
            event_type = value

"""When a container's lines appeared: the engine's log timestamps, read against the moment `docker run` was called.

    t0 = time.time(); container = client.containers.run(image, ["train"], detach=True)
    timeline = Timeline.follow(container, t0)           # reads until the container exits
    timeline.first_job_line, timeline.preflight_ms, timeline.summary_at

The engine stamps each line when the container writes it, on this host's clock, so the numbers do not
include the time it takes to read them. The preflight summary line is `podguard <cmd>: <VERDICT> ... in N
ms` (docs/formats.md); the job's first line is the first after the summary that is not part of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Line", "Timeline", "parse_stamp"]

_SUMMARY = re.compile(r"^podguard (?P<cmd>[a-z-]+): (?P<verdict>PASS|BUSY|UNHEALTHY|FAIL)\b")
_DURATION = re.compile(r" in (?P<ms>\d+(?:\.\d+)?) ms\b")
_STAMPED = re.compile(r"^(?P<stamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))?Z (?P<text>.*)$")


def parse_stamp(stamp: str, frac: str | None) -> float:
    """Docker's RFC 3339 (nanosecond) UTC timestamp as epoch seconds."""
    whole = datetime.fromisoformat(stamp + "+00:00").timestamp()
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


@dataclass(frozen=True)
class Line:
    at: float  # seconds after `docker run` was called
    text: str


@dataclass
class Timeline:
    lines: list[Line] = field(default_factory=list)

    @classmethod
    def from_logs(cls, raw: bytes, t0: float) -> Timeline:
        """From `container.logs(timestamps=True)` output."""
        lines = []
        for row in raw.decode(errors="replace").splitlines():
            match = _STAMPED.match(row)
            if match:
                at = parse_stamp(match.group("stamp"), match.group("frac")) - t0
                lines.append(Line(round(at, 3), match.group("text")))
        return cls(lines)

    @classmethod
    def follow(cls, container: Any, t0: float) -> Timeline:
        """Wait for the container to exit, then read its stamped output."""
        container.wait()
        return cls.from_logs(container.logs(timestamps=True), t0)

    def _summary_index(self) -> int | None:
        return next((i for i, line in enumerate(self.lines) if _SUMMARY.match(line.text)), None)

    @property
    def summary(self) -> Line | None:
        index = self._summary_index()
        return None if index is None else self.lines[index]

    @property
    def verdict(self) -> str | None:
        line = self.summary
        return _SUMMARY.match(line.text).group("verdict") if line else None  # type: ignore[union-attr]

    @property
    def preflight_ms(self) -> float | None:
        """The preflight's own duration, as its summary line reports it."""
        line = self.summary
        match = _DURATION.search(line.text) if line else None
        return float(match.group("ms")) if match else None

    @property
    def first_job_line(self) -> Line | None:
        """The first line after the summary that is not one of its indented detail lines."""
        index = self._summary_index()
        if index is None:
            return None
        return next((line for line in self.lines[index + 1 :] if not line.text.startswith(" ")), None)

    def first(self, needle: str) -> Line | None:
        return next((line for line in self.lines if needle in line.text), None)

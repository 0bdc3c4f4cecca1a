"""Byte-level line handling for the output multiplexer: `\\r` as a line end, cutting very long lines.

    normalise_cr(b"\\r 10%\\r 20%\\n", line_start=True)   # b" 10%\\n 20%\\n"
    cut_long_lines(data)                                  # lines > LINE_CAP in marked chunks
    strip_cursor(b"\\x1b[A\\x1b[2K 30%\\n")               # b" 30%\\n": no cursor moves once lines are cut
    split_hidden(HIDDEN + b"rank1: x\\nrank0: y\\n")      # (b"rank0: y\\n", b"rank1: x\\nrank0: y\\n")
    strip_escapes(b"step \\x1b[1;36m5\\x1b[0m\\n")        # b"step 5\\n": log files and the watch get plain text
    Redraws().filter(b"\\x1b[2K 30%\\n\\x1b[2K 30%\\n")  # b"\\x1b[2K 30%\\n": a repeated redraw goes
    line_key(b"\\x1b[2K\\xe2\\xa0\\x8b 3/10 0:00:12")  # (b"3/10",): a spinner and a clock move by themselves

Whole-buffer operations (`split`, `rfind`, C-level `map`s), never a Python loop per line (`Redraws` alone
loops, over a rich live display's lines only): the rules and why they are fast are in docs/supervisor.md.
"""

from __future__ import annotations

import re
from itertools import repeat

from podguard.rank.marks import ACTIVITY, HIDDEN

__all__ = [
    "ACTIVITY",
    "CONT_END",
    "CONT_START",
    "FRAME_START",
    "HIDDEN",
    "LINE_CAP",
    "Redraws",
    "cut_long",
    "cut_long_lines",
    "drop_activity",
    "line_key",
    "may_have_long_line",
    "normalise_cr",
    "split_hidden",
    "strip_cursor",
    "strip_escapes",
]

LINE_CAP = 64 * 1024  # the longest chunk emitted as one line
CONT_END = b" [podguard: line continues]"
CONT_START = b"[podguard: continued] "
# HIDDEN and ACTIVITY: the rank wrapper's marks (rank/marks.py), re-exported for the line handling here.
# CSI sequences other than SGR (colours): cursor moves and erases (tqdm's `ESC[A`, rich's `ESC[2K`). Once `\r`
# ends a line they would move the cursor over other lines, and a log file shows them as garbage.
_CURSOR = rb"\x1b\[[0-?]*[ -/]*[@-ln-~]"
_CURSOR_ONLY_LINE = re.compile(rb"(?m)^(?:" + _CURSOR + rb")+\n")
_CURSOR_RE = re.compile(_CURSOR)
# Every escape sequence a line may carry: CSI (colours included), OSC (rich's `ESC]8;...ESC\\` hyperlinks, a
# window title) and the two-byte ones. The log files and the watch get text without them: a rich console
# under TTY_COMPATIBLE colours each number (`step ESC[1;36m5ESC[0m`), which a `--progress 'step (\\d+)'`
# would no longer match.
_ESCAPE = rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[()][0-9A-Za-z]|[@-Z\\-_])"
_ESCAPE_ONLY_LINE = re.compile(rb"(?m)^(?:" + _ESCAPE + rb")+\n")
_ESCAPE_RE = re.compile(_ESCAPE)
# A rich live display (Progress, track(), Lightning's bar) starts each redraw by erasing the line; its refresh
# thread redraws 4-10 times a second whether or not anything moved.
FRAME_START = b"\x1b[2K"


def normalise_cr(data: bytes, line_start: bool) -> bytes:
    """Make every '\\r' and '\\r\\n' end a line ('\\n'), dropping empty '\\r' segments.

    Split on '\\r'; the separator put back between two pieces is '' when the next piece starts with
    '\\n' (a '\\r\\n': that '\\n' is the line end, also for an empty line) or when the previous
    piece ends an empty line (an empty '\\r' segment, e.g. tqdm's leading '\\r'), else '\\n'. The
    per-piece tests run as C-level `map`s; two-byte `replace` passes or a Python loop per '\\r' cost
    3-10x more on a megabyte of log lines.
    """
    parts = data.split(b"\r")
    if len(parts) == 1:
        return data
    heads = parts[:-1]
    seps = [
        b"" if crlf or ends_line or not size else b"\n"
        for crlf, ends_line, size in zip(
            map(bytes.startswith, parts[1:], repeat(b"\n")),
            map(bytes.endswith, heads, repeat(b"\n")),
            map(len, heads),
            strict=True,
        )
    ]
    if not parts[0] and not line_start and not parts[1].startswith(b"\n"):
        seps[0] = b"\n"  # the '\\r' ends a line whose start was already emitted (a cut long line)
    out = [b""] * (2 * len(parts) - 1)
    out[0::2] = parts
    out[1::2] = seps
    return b"".join(out)


def may_have_long_line(data: bytes) -> bool:
    """False when every line in `data` is surely <= LINE_CAP: each half-cap block holds a newline."""
    if len(data) <= LINE_CAP:
        return False
    half = LINE_CAP // 2
    find = data.find
    return any(find(b"\n", i, i + half) < 0 for i in range(0, len(data), half))


def _cut_point(data: bytes, limit: int) -> int:
    """A cut at or below `limit` that does not split a UTF-8 character."""
    cut = limit
    while cut > limit - 4 and cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > limit - 4 else limit


def cut_long(line: bytes) -> list[bytes]:
    """Split one line (without its newline) into marked chunks of at most LINE_CAP bytes."""
    pieces: list[bytes] = []
    room = LINE_CAP - len(CONT_END)
    first = True
    while True:
        head = b"" if first else CONT_START
        limit = room - len(head)
        if len(line) <= LINE_CAP - len(head):
            pieces.append(head + line)
            return pieces
        cut = _cut_point(line, limit)
        pieces.append(head + line[:cut] + CONT_END)
        line = line[cut:]
        first = False


def cut_long_lines(data: bytes) -> bytes:
    lines = data.split(b"\n")
    last = lines.pop()  # b"" because data ends with a newline
    out: list[bytes] = []
    for line in lines:
        if len(line) > LINE_CAP:
            out.extend(cut_long(line))
        else:
            out.append(line)
    out.append(last)
    return b"\n".join(out)


def strip_cursor(data: bytes) -> bytes:
    """Remove cursor moves and erases (keeping colours); a line made of nothing else goes whole."""
    if b"\x1b[" not in data:
        return data
    return _CURSOR_RE.sub(b"", _CURSOR_ONLY_LINE.sub(b"", data))


def strip_escapes(data: bytes) -> bytes:
    """Remove every escape sequence (colours too); a line made of nothing else goes whole."""
    if b"\x1b" not in data:
        return data
    return _ESCAPE_RE.sub(b"", _ESCAPE_ONLY_LINE.sub(b"", data))


class Redraws:
    """Drops the lines of a rich live display's redraw that repeat the line at the same place in the redraw
    before (a redraw starts with FRAME_START and runs to the next one; it may span reads, its last line ends
    only with the next redraw's `\\r`). rich's refresh thread redraws a stalled `track()` bar 10 times a second:
    as lines, the repeats filled the log file and counted as activity, so a hung job was never called hung.
    A line repeats when its counts are the same: its escape codes (colours, a pulsing bar), its clocks
    (`0:00:12`, `-:--:--`: rich's elapsed and remaining columns) and its spinner (a token of at most 3 symbols,
    no letter or digit: `⠋`, `|`, `◐`) are not compared, so a stalled bar whose clock runs, or `console.status()`'s
    spinner, is not progress; a redraw in which a count moved keeps its changed lines. Lines behind a launcher's
    prefix (`rank0:` under torchrun, the rank wrapper's HIDDEN mark) are redraws of that prefix's own display:
    ranks that share a stream keep apart."""

    MAX_LINES = 200  # a redraw longer than this is not a live display: stop comparing
    MAX_PREFIX = 64  # bytes before FRAME_START that can be a launcher's line prefix

    def __init__(self) -> None:
        self._frames: dict[bytes, _Frames] = {}  # line prefix (b"" for none) -> that display's redraws

    @property
    def active(self) -> bool:
        """Inside a redraw (its next lines belong to it)."""
        return any(f.cur is not None for f in self._frames.values())

    def filter(self, lines: bytes) -> bytes:
        """Complete `lines` (each ending in a newline) without the repeated ones."""
        every = lines.split(b"\n")
        end = every.pop()  # b"": `lines` ends with a newline
        kept: list[bytes] = []
        for line in every:
            at = line.find(FRAME_START)
            if 0 <= at <= self.MAX_PREFIX and (at == 0 or _is_prefix(line[:at])):
                frames = self._frames.setdefault(line[:at], _Frames())
                key = line_key(line[at:])
                if frames.cur is not None:
                    frames.prev = frames.cur
                frames.cur = [key]
                if not frames.prev or frames.prev[0] != key:
                    kept.append(line)
                continue
            prefix, frames = self._continued(line)
            if frames is None or frames.cur is None:
                kept.append(line)
                continue
            pos = len(frames.cur)
            key = line_key(line[len(prefix) :])
            frames.cur.append(key)
            if pos >= len(frames.prev) or frames.prev[pos] != key:
                kept.append(line)
            if pos >= self.MAX_LINES:
                frames.cur = None
        return b"\n".join([*kept, end]) if kept else b""

    def _continued(self, line: bytes) -> tuple[bytes, _Frames | None]:
        """The redraw under way that `line` continues: the one of its prefix, else the unprefixed one."""
        for prefix, frames in self._frames.items():
            if prefix and frames.cur is not None and line.startswith(prefix):
                return prefix, frames
        return b"", self._frames.get(b"")


class _Frames:
    """One live display's redraws: the lines (as keys) of the previous redraw and of the one under way."""

    def __init__(self) -> None:
        self.prev: list[tuple[bytes, ...]] = []
        self.cur: list[tuple[bytes, ...]] | None = None  # None: outside any redraw


_CLOCK = re.compile(rb"(?:\d+:)?\d{1,2}:\d\d(?:\.\d+)?|-?-:--(?::--)?")
_WORDISH = re.compile(r"\w")


def line_key(line: bytes) -> tuple[bytes, ...]:
    """What a live display's line says, without what moves by itself: escape codes, clocks, a spinner."""
    return tuple(token for token in strip_escapes(line).split() if not _moves_by_itself(token))


def _moves_by_itself(token: bytes) -> bool:
    if _CLOCK.fullmatch(token):
        return True
    text = token.decode("utf-8", "replace")
    return len(text) <= 3 and _WORDISH.search(text) is None


def _is_prefix(head: bytes) -> bool:
    """A launcher's line prefix before a redraw (`rank0:`, HIDDEN `rank1:`): short, printable, no escape."""
    bare = head.removeprefix(HIDDEN)
    return b"\x1b" not in bare and b"\r" not in bare


def drop_activity(lines: bytes) -> tuple[bytes, int]:
    """(`lines` without the ACTIVITY lines, how many there were) for complete `lines` holding ACTIVITY."""
    every = lines.split(b"\n")
    last = every.pop()  # b"": `lines` ends with a newline
    kept = [line for line in every if ACTIVITY not in line]
    return (b"\n".join([*kept, last]) if kept else b""), len(every) - len(kept)


def split_hidden(lines: bytes) -> tuple[bytes, bytes]:
    """(the lines for the terminal, every line with the marker removed) for complete `lines` holding HIDDEN."""
    every = lines.split(b"\n")
    last = every.pop()  # b"": `lines` ends with a newline
    shown = [line for line in every if not line.startswith(HIDDEN)]
    return b"\n".join([*shown, last]) if shown else b"", lines.replace(HIDDEN, b"")

"""Byte-level line handling for the output multiplexer: `\\r` as a line end, cutting very long lines.

    normalise_cr(b"\\r 10%\\r 20%\\n", line_start=True)   # b" 10%\\n 20%\\n"
    cut_long_lines(data)                                  # lines > LINE_CAP in marked chunks
    strip_cursor(b"\\x1b[A\\x1b[2K 30%\\n")               # b" 30%\\n": no cursor moves once lines are cut
    split_hidden(HIDDEN + b"rank1: x\\nrank0: y\\n")      # (b"rank0: y\\n", b"rank1: x\\nrank0: y\\n")
    strip_escapes(b"step \\x1b[1;36m5\\x1b[0m\\n")        # b"step 5\\n": log files and the watch get plain text
    Redraws().filter(b"\\x1b[2K 30%\\n\\x1b[2K 30%\\n")  # b"\\x1b[2K 30%\\n": a repeated redraw goes

Whole-buffer operations (`split`, `rfind`, C-level `map`s), never a Python loop per line (`Redraws` alone
loops, over a rich live display's lines only): the rules and why they are fast are in docs/supervisor.md.
"""

from __future__ import annotations

import re
from itertools import repeat

__all__ = [
    "CONT_END",
    "CONT_START",
    "FRAME_START",
    "HIDDEN",
    "LINE_CAP",
    "Redraws",
    "cut_long",
    "cut_long_lines",
    "may_have_long_line",
    "normalise_cr",
    "split_hidden",
    "strip_cursor",
    "strip_escapes",
]

LINE_CAP = 64 * 1024  # the longest chunk emitted as one line
CONT_END = b" [podguard: line continues]"
CONT_START = b"[podguard: continued] "
# Put before a line that goes to the log files and the watch but not to the terminal (the torchrun rank
# wrapper marks the lines of ranks `--only-gpu` hides). An OSC string: a terminal that got one would show nothing.
HIDDEN = b"\x1b]podguard-hidden\x07"
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
    A redraw in which something moved keeps its changed lines."""

    MAX_LINES = 200  # a redraw longer than this is not a live display: stop comparing

    def __init__(self) -> None:
        self.prev: list[bytes] = []  # the lines of the previous redraw
        self.cur: list[bytes] | None = None  # the lines of the redraw under way; None: outside any

    def filter(self, lines: bytes) -> bytes:
        """Complete `lines` (each ending in a newline) without the repeated ones."""
        every = lines.split(b"\n")
        end = every.pop()  # b"": `lines` ends with a newline
        kept: list[bytes] = []
        for line in every:
            if line.startswith(FRAME_START):
                if self.cur is not None:
                    self.prev = self.cur
                self.cur = [line]
                if not self.prev or self.prev[0] != line:
                    kept.append(line)
            elif self.cur is not None:
                pos = len(self.cur)
                self.cur.append(line)
                if pos >= len(self.prev) or self.prev[pos] != line:
                    kept.append(line)
                if pos >= self.MAX_LINES:
                    self.cur = None
            else:
                kept.append(line)
        return b"\n".join([*kept, end]) if kept else b""


def split_hidden(lines: bytes) -> tuple[bytes, bytes]:
    """(the lines for the terminal, every line with the marker removed) for complete `lines` holding HIDDEN."""
    every = lines.split(b"\n")
    last = every.pop()  # b"": `lines` ends with a newline
    shown = [line for line in every if not line.startswith(HIDDEN)]
    return b"\n".join([*shown, last]) if shown else b"", lines.replace(HIDDEN, b"")

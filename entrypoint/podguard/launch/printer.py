"""The output multiplexer: every worker's pipe in, whole prefixed lines out.

honcho's Printer, made fast and strict. Each worker has its own pipe (see `process.py`); the Printer
reads whatever is available (non-blocking, up to 1 MiB at a time), keeps the bytes after the last
line end as that worker's *pending* partial line, and turns the complete part into output with a few
whole-buffer byte operations (`rfind`, `replace`) instead of a Python loop per line. The result for a
batch of lines is appended to one output buffer that is written with one `write` per round of the
event loop, so lines never interleave mid-line and podguard's own messages stay in order with them.

Rules (what users see):

* **Whole lines only.** A line is printed once its end arrives. A worker that dies mid-line still has
  its partial last line printed (with a newline added) when its pipe reaches EOF: nothing is lost.
* **Prefix** (`GPU0:` …) before every line on the terminal; the per-worker log file gets the same
  lines without the prefix.
* **`\\r` ends a line.** Progress bars (tqdm, pip) redraw with `\\r`. Kept raw, eight interleaved bars
  overwrite each other and the next worker's line on a terminal, and a whole epoch of redraws becomes
  one multi-megabyte "line" in `docker logs`. So `\\r` and `\\r\\n` both end a line (what Python's
  universal newlines — and therefore torchrun's `--tee` — do too), and a redraw shows up as one
  prefixed line per update. Empty `\\r` segments (tqdm starts every redraw with `\\r`) are dropped,
  empty `\\n` lines are kept. A redraw is printed once the next one starts (that is when its end is
  known), so a bar lags one update behind.
* **Very long lines** are emitted in chunks of at most `LINE_CAP` (64 KiB) bytes: a chunk that is cut
  ends with ` [podguard: line continues]` and the next chunk begins with `[podguard: continued] `.
  Cuts fall on UTF-8 character boundaries. Nothing is dropped, and a worker that never writes a
  newline cannot make podguard buffer without bound.
* **Filter**: `only` names the workers whose lines go to the terminal (`--only-gpu 2` = the seed's
  `grep "GPU2:"`); every worker's lines still go to its log file.
* The last `tail_lines` lines of each worker are kept for the failure summary, from a bounded window
  of its most recent output (`TAIL_BYTES`), so keeping them costs nothing per line.
* Line watchers (`watch(name, fn)`, or `on_line` for every worker) get each line as `str` — this is
  the only per-line Python work, paid only where someone listens (roles mode: "ready when this log
  line appears").
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import BinaryIO, TextIO

LINE_CAP = 64 * 1024  # the longest chunk emitted as one line
READ_SIZE = 1 << 20  # matches the 1 MiB pipes made by process.py
TAIL_BYTES = 32 * 1024  # window kept per worker for its last lines
CONT_END = b" [podguard: line continues]"
CONT_START = b"[podguard: continued] "

LineCallback = Callable[[str, str], None]  # (worker name, line without its newline)


@dataclass(eq=False)
class Stream:
    """One worker's output stream and its state inside the Printer."""

    name: str
    fd: int | None  # None for streams fed by hand (tests, benchmarks)
    prefix: bytes
    visible: bool
    log_fd: int | None = None
    pending: bytes = b""  # bytes after the last line end: the partial line being written
    continued: bool = False  # `pending` is the rest of a line that was already cut at LINE_CAP
    window: bytes = b""  # the most recent <= TAIL_BYTES of normalised output, for tail()
    window_cut: bool = False  # the window dropped older output: its first line may be partial
    eof: bool = False
    watchers: list[LineCallback] = field(default_factory=list)


class _Sink:
    """Where the terminal side goes: a raw fd when there is one (fast path), else any .write(bytes)."""

    def __init__(self, out: BinaryIO | TextIO | int | None) -> None:
        self.fd: int | None = None
        self.obj: BinaryIO | TextIO | None = None
        self.text = False  # a text stream without a binary buffer (io.StringIO, captured stdout)
        if out is None:
            out = sys.stdout
        if isinstance(out, int):
            self.fd = out
            return
        with contextlib.suppress(Exception):
            out.flush()  # whatever the caller printed before must come first
        try:
            self.fd = out.fileno()
        except (AttributeError, OSError, ValueError):
            buffer = getattr(out, "buffer", None)
            self.obj = buffer if buffer is not None else out
            self.text = buffer is None and isinstance(out, io.TextIOBase)

    def write(self, data: bytes) -> None:
        if self.fd is not None:
            write_all(self.fd, data)
        elif self.obj is not None:
            self.obj.write(data.decode("utf-8", "replace") if self.text else data)  # type: ignore[arg-type]
            with contextlib.suppress(Exception):
                self.obj.flush()


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, across partial writes and a non-blocking fd."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll(1000)
            continue
        except BrokenPipeError:
            return  # the reader went away (e.g. `| head`): keep supervising, stop printing
        view = view[n:]


def _normalise_cr(data: bytes, line_start: bool) -> bytes:
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


def _may_have_long_line(data: bytes) -> bool:
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


def _cut_long(line: bytes) -> list[bytes]:
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


def _cut_long_lines(data: bytes) -> bytes:
    lines = data.split(b"\n")
    last = lines.pop()  # b"" because data ends with a newline
    out: list[bytes] = []
    for line in lines:
        if len(line) > LINE_CAP:
            out.extend(_cut_long(line))
        else:
            out.append(line)
    out.append(last)
    return b"\n".join(out)


class Printer:
    """Multiplex worker streams into one output; see the module docstring for the rules."""

    def __init__(
        self,
        out: BinaryIO | TextIO | int | None = None,
        *,
        only: Collection[str] | None = None,
        on_line: LineCallback | None = None,
        tail_lines: int = 20,
    ) -> None:
        self._sink = _Sink(out)
        self._only = set(only) if only is not None else None
        self._on_line = on_line
        self.tail_lines = tail_lines
        self.streams: dict[str, Stream] = {}
        self._by_fd: dict[int, Stream] = {}
        self._out: list[bytes] = []

    # -- streams ------------------------------------------------------------------------------------
    def add(self, name: str, fd: int | None, *, prefix: str = "", log_path: Path | None = None) -> Stream:
        """Register a worker's stream. The log file is opened for appending (created with its dirs)."""
        log_fd = None
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        stream = Stream(
            name=name,
            fd=fd,
            prefix=prefix.encode(),
            visible=self._only is None or name in self._only,
            log_fd=log_fd,
        )
        if self._on_line is not None:
            stream.watchers.append(self._on_line)
        self.streams[name] = stream
        if fd is not None:
            self._by_fd[fd] = stream
        return stream

    def watch(self, name: str, callback: LineCallback) -> None:
        """Call `callback(name, line)` for each further line of worker `name`."""
        self.streams[name].watchers.append(callback)

    def unwatch(self, name: str, callback: LineCallback) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.streams[name].watchers.remove(callback)

    def stream_for_fd(self, fd: int) -> Stream:
        return self._by_fd[fd]

    # -- input --------------------------------------------------------------------------------------
    def read(self, stream: Stream, *, limit: int = 1) -> bool:
        """Read what is available from the stream's pipe (at most `limit` big reads).

        Returns False once the pipe reached EOF; the caller then unregisters the fd and calls `close()`.
        """
        assert stream.fd is not None
        for _ in range(limit):
            try:
                data = os.read(stream.fd, READ_SIZE)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                return False
            self.feed(stream, data)
            if len(data) < READ_SIZE:
                return True
        return True

    def drain(self, stream: Stream, *, max_bytes: int = 64 << 20) -> bool:
        """Read everything already in the pipe (a worker just exited). False at EOF."""
        if stream.fd is None:
            return not stream.eof
        return self.read(stream, limit=max(1, max_bytes // READ_SIZE))

    def feed(self, stream: Stream, data: bytes) -> None:
        """Process raw bytes from a worker: emit every complete line, keep the partial rest.

        A '\\r' that is the very last byte waits in `pending` for the next read: it may be the
        first half of a '\\r\\n' (one line end, not two).
        """
        buf = stream.pending + data if stream.pending else data
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        cut = max(buf.rfind(b"\n", 0, end), buf.rfind(b"\r", 0, end))
        if cut < 0:
            stream.pending = buf
            if len(buf) > LINE_CAP:
                self._overflow(stream)
            return
        complete = buf[: cut + 1]
        stream.pending = buf[cut + 1 :]
        if b"\r" in complete:
            complete = _normalise_cr(complete, line_start=not stream.continued)
            if not complete:
                return
        if stream.continued:
            complete = CONT_START + complete
            stream.continued = False
        if _may_have_long_line(complete):
            complete = _cut_long_lines(complete)
        self._emit(stream, complete)
        if len(stream.pending) > LINE_CAP:
            self._overflow(stream)

    def _overflow(self, stream: Stream) -> None:
        """A partial line grew past LINE_CAP: emit it in marked chunks, keep the last bit pending."""
        line = (CONT_START if stream.continued else b"") + stream.pending.removesuffix(b"\r")
        pieces = _cut_long(line)
        tail = pieces.pop()  # the unfinished remainder (starts with CONT_START) stays pending
        stream.pending = tail[len(CONT_START) :] + (b"\r" if stream.pending.endswith(b"\r") else b"")
        stream.continued = True
        self._emit(stream, b"\n".join(pieces) + b"\n")

    def close(self, stream: Stream) -> None:
        """EOF: flush the partial last line (with a newline added) and close the fd and log file."""
        if stream.eof:
            return
        stream.eof = True
        if stream.pending:
            # `pending` holds no line end, except perhaps one last '\\r' (see feed)
            rest = stream.pending.removesuffix(b"\r")
            if rest or not stream.pending.endswith(b"\r"):
                self._emit(stream, (CONT_START if stream.continued else b"") + rest + b"\n")
            stream.pending = b""
            stream.continued = False
        if stream.fd is not None:
            self._by_fd.pop(stream.fd, None)
            with contextlib.suppress(OSError):
                os.close(stream.fd)
        if stream.log_fd is not None:
            with contextlib.suppress(OSError):
                os.close(stream.log_fd)
            stream.log_fd = None

    # -- output -------------------------------------------------------------------------------------
    def _emit(self, stream: Stream, lines: bytes) -> None:
        """`lines`: one or more complete lines, each ending in b'\\n'."""
        if stream.visible:
            prefix = stream.prefix
            if prefix:
                self._out.append(prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n")
            else:
                self._out.append(lines)
        if stream.log_fd is not None:
            try:
                write_all(stream.log_fd, lines)
            except OSError:  # disk full: the terminal copy still goes out
                stream.log_fd = None
        if len(lines) >= TAIL_BYTES:
            stream.window = lines[-TAIL_BYTES:]
            stream.window_cut = True
        else:
            window = stream.window + lines
            if len(window) > TAIL_BYTES:
                window = window[-TAIL_BYTES:]
                stream.window_cut = True
            stream.window = window
        if stream.watchers:
            for raw in lines[:-1].split(b"\n"):
                text = raw.decode("utf-8", "replace")
                for callback in list(stream.watchers):
                    callback(stream.name, text)

    def message(self, text: str) -> None:
        """podguard's own line(s), in order with the workers' output."""
        data = text.encode("utf-8", "replace")
        self._out.append(data if data.endswith(b"\n") else data + b"\n")

    def flush(self) -> None:
        """Write everything gathered in this round with one system call (`writev`, no joining copy)."""
        if not self._out:
            return
        bufs = self._out
        self._out = []
        if self._sink.fd is None or len(bufs) == 1 or len(bufs) > 512:
            self._sink.write(bufs[0] if len(bufs) == 1 else b"".join(bufs))
            return
        try:
            done = os.writev(self._sink.fd, bufs)
        except (BlockingIOError, InterruptedError):
            done = 0
        except BrokenPipeError:
            return
        total = sum(map(len, bufs))
        if done < total:  # a partial write (pipe full, signal): finish the rest the slow way
            self._sink.write(b"".join(bufs)[done:])

    def tail(self, name: str, n: int | None = None) -> tuple[str, ...]:
        """The last `n` (default `tail_lines`) lines of worker `name` (a pending partial one last)."""
        stream = self.streams.get(name)
        if stream is None:
            return ()
        n = self.tail_lines if n is None else n
        if n <= 0:
            return ()
        data = stream.window + (stream.pending.removesuffix(b"\r") if not stream.eof else b"")
        if data.endswith(b"\n"):
            data = data[:-1]
        if not data:
            return ()
        lines = data.rsplit(b"\n", n)
        if len(lines) > n or (stream.window_cut and len(lines) > 1):
            lines = lines[1:]  # one line too many, or the first one is cut by the window
        return tuple(line.decode("utf-8", "replace") for line in lines)

    def close_all(self) -> None:
        for stream in list(self.streams.values()):
            self.close(stream)
        self.flush()

    def open_streams(self) -> Iterable[Stream]:
        return [s for s in self.streams.values() if not s.eof and s.fd is not None]


def wait_readable(fds: Collection[int], timeout: float) -> None:
    """Tiny helper for tests and benchmarks: wait until one fd is readable or `timeout` passed."""
    if fds:
        select.select(list(fds), [], [], timeout)
    else:
        time.sleep(min(timeout, 0.05))

"""The output multiplexer: every worker's pipe in, whole prefixed lines out.

    printer = Printer(sys.stdout, only={"GPU2"})
    stream = printer.add("GPU2", worker.fd, prefix="GPU2:", log_path=logs / "GPU2.log")
    printer.read(stream); printer.flush()          # in the supervisor's event loop
    printer.tail("GPU2")                          # its last lines, for the failure summary

honcho's Printer, made fast and strict: whole lines only (a dying worker's partial line is kept), `\\r`
ends a line, cursor moves and repeated redraws are dropped, very long lines are cut in marked chunks,
`only` and the rank wrapper's HIDDEN mark filter the terminal (the log files and the watchers get every
line, as plain text: escape sequences, colours included, only reach the terminal), each worker's last
lines and first traceback are kept for the summary. A lone unprefixed worker on a real terminal gets
the terminal raw (its progress bars redraw in place); its log file and watchers still get clean lines.
The rules and the fast paths: docs/supervisor.md. With `background=True` (the supervisor) the terminal and
the log files are written from helper threads with bounded queues (`sinks.py`): a slow sink never stalls
the event loop.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from podguard.launch.console import Console
from podguard.launch.errorlines import HEADER, FirstError, SignalTraceback
from podguard.launch.lines import (
    ACTIVITY,
    CONT_END,
    CONT_START,
    FRAME_START,
    HIDDEN,
    LINE_CAP,
    Redraws,
    cut_long,
    cut_long_lines,
    drop_activity,
    may_have_long_line,
    normalise_cr,
    split_hidden,
    strip_cursor,
    strip_escapes,
)
from podguard.launch.sinks import LogFile, LogSink, open_log, write_all

__all__ = ["CONT_END", "CONT_START", "LINE_CAP", "LineCallback", "Printer", "Stream", "wait_readable", "write_all"]

READ_SIZE = 1 << 20  # matches the 1 MiB pipes made by process.py
TAIL_BYTES = 32 * 1024  # window kept per worker for its last lines

LineCallback = Callable[[str, str], None]  # (worker name, line without its newline)
ActivityCallback = Callable[[str], None]  # (worker name): bytes arrived that end no line (a dot per step)


@dataclass(eq=False)
class Stream:
    """One worker's output stream and its state inside the Printer."""

    name: str
    fd: int | None  # None for streams fed by hand (tests, benchmarks)
    prefix: bytes
    visible: bool
    log: LogFile | None = None
    pending: bytes = b""  # bytes after the last line end: the partial line being written
    continued: bool = False  # `pending` is the rest of a line that was already cut at LINE_CAP
    window: bytes = b""  # the most recent <= TAIL_BYTES of normalised output, for tail()
    window_cut: bool = False  # the window dropped older output: its first line may be partial
    eof: bool = False
    watchers: list[LineCallback] = field(default_factory=list)
    raw_ok: bool = False  # a lone unprefixed worker on a tty: once it redraws with '\r', the terminal goes raw
    raw: bool = False  # the terminal gets this stream's bytes as they come (its bars redraw in place)
    first_error: FirstError = field(default_factory=FirstError)
    condense: SignalTraceback = field(default_factory=SignalTraceback)
    redraws: Redraws = field(default_factory=Redraws)  # a rich live display's repeated lines are dropped


class Printer:
    """Multiplex worker streams into one output; see the module docstring for the rules."""

    def __init__(
        self,
        terminal: BinaryIO | TextIO | int | None = None,
        *,
        only: Collection[str] | None = None,
        on_line: LineCallback | None = None,
        tail_lines: int = 20,
        background: bool = False,
        on_drained: Callable[[], None] | None = None,
    ) -> None:
        self._term = Console(terminal, background=background, on_drained=on_drained)  # stdout; stderr when it stalls
        self._colour = self._term.isatty()  # rich's colours (TTY_COMPATIBLE) only where a person watches
        self._logs = LogSink(background=background, on_drained=on_drained)
        self._only = set(only) if only is not None else None
        self._on_line = on_line
        self._all_watchers: list[LineCallback] = []
        self._activity: list[ActivityCallback] = []
        self._term_midline = False  # a raw stream left the terminal in the middle of a line
        self.tail_lines = tail_lines
        self.streams: dict[str, Stream] = {}
        self._by_fd: dict[int, Stream] = {}
        self._out: list[bytes] = []
        self._log_out: list[tuple[LogFile, bytes]] = []

    # -- streams ------------------------------------------------------------------------------------
    def add(self, name: str, fd: int | None, *, prefix: str = "", log_path: Path | None = None) -> Stream:
        """Register a worker's stream. Its log file is opened for appending (created with its folders);
        a log file that cannot be opened is reported once and the worker runs without it."""
        log = None
        if log_path is not None:
            try:
                log = open_log(name, Path(log_path))
            except OSError as exc:
                self._log_warning(name, Path(log_path), exc, "cannot be opened")
        stream = Stream(
            name=name,
            fd=fd,
            prefix=prefix.encode(),
            visible=self._only is None or name in self._only,
            log=log,
        )
        for other in self.streams.values():  # raw only while it is the only stream
            self._end_raw(other)
        stream.raw_ok = not prefix and stream.visible and not self.streams and self._term.isatty()
        if self._on_line is not None:
            stream.watchers.append(self._on_line)
        stream.watchers.extend(self._all_watchers)
        self.streams[name] = stream
        if fd is not None:
            self._by_fd[fd] = stream
        return stream

    def watch_all(self, callback: LineCallback) -> None:
        """Call `callback(name, line)` for each further line of every worker, present and future."""
        self._all_watchers.append(callback)
        for stream in self.streams.values():
            stream.watchers.append(callback)

    def watch_activity(self, callback: ActivityCallback) -> None:
        """Call `callback(name)` when a worker's bytes arrive that end no line (output without line ends)."""
        self._activity.append(callback)

    def watch(self, name: str, callback: LineCallback) -> None:
        """Call `callback(name, line)` for each further line of worker `name`."""
        self.streams[name].watchers.append(callback)

    def unwatch(self, name: str, callback: LineCallback) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.streams[name].watchers.remove(callback)

    def stream_for_fd(self, fd: int) -> Stream:
        return self._by_fd[fd]

    @property
    def congested(self) -> bool:
        """The terminal or the log files are more than their high-water mark behind: stop reading."""
        return self._term.congested or self._logs.congested

    @property
    def backlog(self) -> int:
        """Bytes handed to the sinks and not written yet (terminal and log files together)."""
        return self._term.backlog + self._logs.backlog

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
        if stream.raw_ok and not stream.raw and data.count(b"\r") > data.count(b"\r\n"):
            stream.raw = True  # it redraws in place: let the terminal do that (the line so far first)
            self._out.append(stream.pending)
        if stream.raw:
            if HIDDEN in data or ACTIVITY in data:  # the rank wrapper's marked lines must not reach the terminal
                self._end_raw(stream)
            else:
                self._out.append(data)
                self._term_midline = not data.endswith(b"\n")
        buf = stream.pending + data if stream.pending else data
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        cut = max(buf.rfind(b"\n", 0, end), buf.rfind(b"\r", 0, end))
        if cut < 0:
            stream.pending = buf
            if data:
                for callback in self._activity:
                    callback(stream.name)
            if len(buf) > LINE_CAP:
                self._overflow(stream)
            return
        complete = buf[: cut + 1]
        stream.pending = buf[cut + 1 :]
        if b"\r" in complete:
            complete = normalise_cr(complete, line_start=not stream.continued)
        if b"\x1b" in complete and ACTIVITY in complete:  # the rank wrapper: output without a line end arrived
            complete, marks = drop_activity(complete)
            for callback in self._activity if marks else ():
                callback(stream.name)
        if stream.redraws.active or (b"\x1b" in complete and FRAME_START in complete):
            complete = stream.redraws.filter(complete)  # a rich live display: what its redraws repeat goes
        if b"\x1b" in complete and b"\x1b[" in complete:  # (memchr first: a 2-byte search is 80x slower)
            complete = strip_cursor(complete)
        if not complete:
            return
        if stream.continued:
            complete = CONT_START + complete
            stream.continued = False
        if may_have_long_line(complete):
            complete = cut_long_lines(complete)
        self._emit(stream, complete)
        if len(stream.pending) > LINE_CAP:
            self._overflow(stream)

    def _overflow(self, stream: Stream) -> None:
        """A partial line grew past LINE_CAP: emit it in marked chunks, keep the last bit pending."""
        line = (CONT_START if stream.continued else b"") + stream.pending.removesuffix(b"\r")
        pieces = cut_long(line)
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
                last = stream.redraws.filter(rest + b"\n") if stream.redraws.active else rest + b"\n"
                last = strip_cursor(last)  # (rich's last `ESC[?25h` alone: nothing to show)
                if last:
                    self._emit(stream, (CONT_START if stream.continued else b"") + last)
            stream.pending = b""
            stream.continued = False
        self._end_raw(stream)  # (after its last partial line: the terminal had it already)
        if stream.visible:
            self._show(stream, stream.condense.flush())
        if stream.fd is not None:
            self._by_fd.pop(stream.fd, None)
            with contextlib.suppress(OSError):
                os.close(stream.fd)
        if stream.log is not None:
            self._flush_logs()  # its last lines first
            self._logs.close_file(stream.log)
            stream.log = None

    # -- output -------------------------------------------------------------------------------------
    def _end_raw(self, stream: Stream) -> None:
        """From now on the stream's terminal lines go through the normal path (a new line if it was mid-line)."""
        stream.raw_ok = False
        if stream.raw:
            stream.raw = False
            self._end_midline()

    def _show(self, stream: Stream, lines: bytes) -> None:
        """Complete lines to the terminal, prefixed."""
        if not lines:
            return
        prefix = stream.prefix
        if prefix:
            self._out.append(prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n")
        else:
            self._out.append(lines)

    def _end_midline(self) -> None:
        if self._term_midline:
            self._out.append(b"\n")
            self._term_midline = False

    def _emit(self, stream: Stream, lines: bytes) -> None:
        """`lines`: one or more complete lines, each ending in b'\\n'."""
        shown = lines  # a terminal keeps colours; the log file, the watchers, the tail and a pipe get plain text
        if b"\x1b" in lines:
            if HIDDEN in lines:
                shown, lines = split_hidden(lines)
            lines = strip_escapes(lines)
            if not self._colour:  # container logs (RunPod's log view, `docker logs`): no escape codes
                shown = strip_escapes(shown)
        traceback = HEADER in lines  # one scan for both watchers of tracebacks
        if stream.visible and shown and not stream.raw:
            self._show(stream, stream.condense.feed(shown) if traceback or stream.condense.held else shown)
        if not lines:
            return
        if traceback or stream.first_error.inside:
            stream.first_error.feed(lines)
        elif stream.first_error.done:
            stream.first_error.went_on(time.monotonic())
        if stream.log is not None:
            self._log_out.append((stream.log, lines))
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

    def message(self, text: str, *, loud: bool = False) -> None:
        """podguard's own line(s), in order with the workers' output; `loud` ones (HUNG, a summary) also reach
        stderr when stdout is stalled (console.py)."""
        data = text.encode("utf-8", "replace")
        self._end_midline()
        self._flush_terminal()
        self._term.say(data if data.endswith(b"\n") else data + b"\n", loud=loud)

    def _log_warning(self, name: str, path: Path, exc: OSError, what: str) -> None:
        reason = exc.strerror or type(exc).__name__
        self.message(f"podguard: warning: log file {path} {what} ({reason}); {name}'s lines go to the terminal only")

    def _flush_logs(self) -> None:
        if self._log_out:
            batch, self._log_out = self._log_out, []
            for log, data in batch:
                self._logs.submit(log, data)
        for log in self._logs.failures():
            assert log.error is not None
            self._log_warning(log.name, log.path, log.error, "could not be written")

    def flush(self) -> None:
        """Hand everything gathered in this round to the sinks (one `writev` for the terminal)."""
        self._flush_logs()
        self._flush_terminal()
        self._term.check()

    def _flush_terminal(self) -> None:
        if self._out:
            bufs, self._out = self._out, []
            self._term.show(bufs)

    def finish(self, *, stall_s: float = 1.0, cap_s: float = 3.0) -> bool:
        """Flush and wait for the sinks (bounded: a stalled terminal gives up); True when all was written."""
        self.flush()
        logs_done = self._logs.close(stall_s=stall_s, cap_s=cap_s)
        self.flush()  # a warning about a log file that failed while closing
        return self._term.close(stall_s=stall_s, cap_s=cap_s) and logs_done

    def first_error(self, name: str) -> tuple[str, ...]:
        """Worker `name`'s first traceback (shortened), () when it printed none."""
        stream = self.streams.get(name)
        return stream.first_error.lines if stream is not None else ()

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

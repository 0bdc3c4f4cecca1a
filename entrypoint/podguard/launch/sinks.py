"""Where multiplexed output goes: the terminal and per-worker log files, written off the event loop.

    term = TerminalSink(sys.stdout, background=True, on_drained=wake_loop)
    term.submit([b"GPU0:hello\\n"])      # never blocks; `term.congested` says when to stop reading workers
    logs = LogSink(background=True, on_drained=wake_loop)
    logs.submit(open_log("GPU0", path), b"hello\\n")
    term.close(stall_s=1.0, cap_s=3.0)   # bounded: a stalled terminal cannot hold podguard at exit

A slow volume or a blocked stdout must not delay signal forwarding, reaping or the kill deadline, so with
`background=True` each sink writes in its own daemon thread from a bounded queue; the supervisor stops
reading the workers' pipes while a queue is over its high-water mark (the workers then block on their own
pipes, as they would writing to a slow terminal directly) and resumes when it drained; a terminal that takes
nothing at all (stalled) is the console's to handle (console.py: it stops queueing the workers' lines for it). Log
files are best-effort: a write that fails (a full volume) stops that file, reported once. docs/supervisor.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

__all__ = ["HIGH_WATER", "LOW_WATER", "LogFile", "LogSink", "TerminalSink", "open_log", "write_all"]

HIGH_WATER = 8 << 20  # queued bytes above which the supervisor stops reading worker pipes
LOW_WATER = 1 << 20  # ... and below which it reads them again
_WRITEV_MAX = 512  # buffers handed to the terminal per write
CHUNK = 64 << 10  # bytes per write to the terminal: a pipe's default size, so a slow reader shows progress


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, across partial writes and a non-blocking fd. A gone reader is ignored."""
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


class _Queue:
    """A byte-counted queue drained by one daemon thread; `submit` never blocks."""

    def __init__(self, name: str, on_drained: Callable[[], None] | None) -> None:
        self._items: deque[object] = deque()
        self._cond = threading.Condition()
        self._bytes = 0
        self._busy = False  # the thread is writing a batch it took out of the queue
        self._closing = False
        self._written = 0  # bytes written so far (progress, for close())
        self._on_drained = on_drained
        self._was_congested = False
        self._name = name
        self._thread: threading.Thread | None = None  # started with the first item: a quiet job needs none

    @property
    def pending(self) -> int:
        return self._bytes

    def put(self, item: object, size: int) -> None:
        with self._cond:
            self._items.append(item)
            self._bytes += size
            if self._bytes > HIGH_WATER:
                self._was_congested = True
            self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"podguard-{self._name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return
                batch = list(self._items)
                self._items.clear()
                self._busy = True
            size = self.write_batch(batch)
            with self._cond:
                self._busy = False
                self._bytes -= size
                self._written += size
                drained = self._was_congested and self._bytes <= LOW_WATER
                if drained:
                    self._was_congested = False
                self._cond.notify_all()
            if drained and self._on_drained is not None:
                self._on_drained()

    def write_batch(self, batch: list[object]) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self, *, stall_s: float, cap_s: float) -> bool:
        """Let the thread finish what is queued; give up after `stall_s` without progress or `cap_s` in
        all. True when everything was written."""
        deadline = time.monotonic() + cap_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            last, last_change = self._written, time.monotonic()
            while self._items or self._busy:
                now = time.monotonic()
                if self._written != last:
                    last, last_change = self._written, now
                give_up = min(deadline, last_change + stall_s)
                if now >= give_up:
                    return False  # the daemon thread stays blocked in its write; it dies with the process
                self._cond.wait(give_up - now)
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return True


class _Sink:
    """What the terminal and the log files share: an optional background queue (writes off the event loop)."""

    _queue: _Queue | None

    @property
    def congested(self) -> bool:
        """The queue is past its high-water mark: the caller stops reading workers' pipes until it drains."""
        return self._queue is not None and self._queue.pending > HIGH_WATER

    @property
    def backlog(self) -> int:
        """Bytes handed over but not written yet."""
        return self._queue.pending if self._queue is not None else 0

    def close(self, *, stall_s: float = 1.0, cap_s: float = 3.0) -> bool:
        """Flush the queue; False when it stalled (no progress for `stall_s`, or past `cap_s` in all)."""
        return True if self._queue is None else self._queue.close(stall_s=stall_s, cap_s=cap_s)


class TerminalSink(_Sink):
    """The terminal side: a raw fd when there is one, else any `.write(bytes)`. It counts what it wrote and when
    it last wrote (`written`, `moved_at`): the console (console.py) tells a slow terminal from a stalled one."""

    def __init__(
        self,
        terminal: BinaryIO | TextIO | int | None,
        *,
        background: bool = False,
        on_drained: Callable[[], None] | None = None,
    ) -> None:
        self.fd: int | None = None
        self.obj: BinaryIO | TextIO | None = None
        self.text = False  # a text stream without a binary buffer (io.StringIO, captured stdout)
        self.written = 0  # bytes the terminal accepted so far (the writer's thread adds to it)
        self.moved_at = time.monotonic()  # when it last accepted bytes (or bytes began to wait for it)
        self.broken = False  # its reader went away (EPIPE) or it failed (EIO): nothing more reaches it
        if terminal is None:
            terminal = sys.stdout
        if isinstance(terminal, int):
            self.fd = terminal
        else:
            with contextlib.suppress(Exception):
                terminal.flush()  # whatever the caller printed before must come first
            try:
                self.fd = terminal.fileno()
            except (AttributeError, OSError, ValueError):
                buffer = getattr(terminal, "buffer", None)
                self.obj = buffer if buffer is not None else terminal
                self.text = buffer is None and isinstance(terminal, io.TextIOBase)
        self._queue: _TerminalQueue | None = _TerminalQueue(self, on_drained) if background else None

    def isatty(self) -> bool:
        """Whether the output is a real terminal (a person watching it), not a pipe or a file."""
        try:
            return self.fd is not None and os.isatty(self.fd)
        except OSError:
            return False

    def submit(self, bufs: list[bytes]) -> None:
        """Write `bufs` in order: now, or (background) soon, without blocking the caller."""
        if self._queue is not None:
            if self._queue.pending == 0:
                self.moved_at = time.monotonic()  # the clock of a stall starts when bytes begin to wait
            self._queue.put(bufs, sum(map(len, bufs)))
        else:
            self.write(bufs)

    def stuck_s(self, now: float) -> float:
        """How long bytes have waited without the terminal taking any (0 while it keeps up)."""
        return now - self.moved_at if self.backlog > 0 else 0.0

    def write(self, bufs: list[bytes]) -> None:
        """Everything in `bufs`, in pieces of at most CHUNK bytes (so that a slow reader shows its progress)."""
        data = bufs[0] if len(bufs) == 1 else b"".join(bufs)
        if self.fd is None:
            if self.obj is not None and not self.broken:
                try:
                    self.obj.write(data.decode("utf-8", "replace") if self.text else data)  # type: ignore[arg-type]
                    self.obj.flush()
                except (ValueError, OSError):  # a closed or broken stream: stop printing
                    self.broken = True
                    return
                self._moved(len(data))
            return
        view = memoryview(data)
        while view and not self.broken:
            try:
                n = os.write(self.fd, view[:CHUNK])
            except BlockingIOError:
                poller = select.poll()
                poller.register(self.fd, select.POLLOUT)
                poller.poll(1000)
                continue
            except InterruptedError:
                continue
            except OSError:  # EPIPE (`| head` went away), EIO: keep supervising, stop printing
                self.broken = True
                return
            self._moved(n)
            view = view[n:]

    def _moved(self, n: int) -> None:
        self.written += n
        self.moved_at = time.monotonic()


class _TerminalQueue(_Queue):
    def __init__(self, sink: TerminalSink, on_drained: Callable[[], None] | None) -> None:
        self._sink = sink
        super().__init__("output", on_drained)

    def write_batch(self, batch: list[object]) -> int:
        bufs = [b for item in batch for b in item]  # type: ignore[attr-defined]
        for start in range(0, len(bufs), _WRITEV_MAX):
            self._sink.write(bufs[start : start + _WRITEV_MAX])
        return sum(map(len, bufs))


@dataclass(eq=False)
class LogFile:
    """One worker's log file. `error` is set (by the writer) once a write failed; nothing more is written."""

    name: str  # the worker's name
    path: Path
    fd: int
    error: OSError | None = None


def open_log(name: str, path: Path) -> LogFile:
    """Open (append, create with its folders) a worker's log file; OSError when the volume refuses."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    return LogFile(name, Path(path), fd)


class LogSink(_Sink):
    """Per-worker log files (appended, unprefixed). A file whose write fails is dropped and reported once
    through `failures()`: logs are best-effort, the job goes on."""

    def __init__(self, *, background: bool = False, on_drained: Callable[[], None] | None = None) -> None:
        self._failed: deque[LogFile] = deque()
        self._queue: _LogQueue | None = _LogQueue(self, on_drained) if background else None

    def submit(self, log: LogFile, data: bytes) -> None:
        if self._queue is not None:
            self._queue.put((log, data), len(data))
        else:
            self.write(log, data)

    def close_file(self, log: LogFile) -> None:
        """Close the file once everything submitted for it before has been written."""
        if self._queue is not None:
            self._queue.put((log, None), 0)
        else:
            self.write(log, None)

    def write(self, log: LogFile, data: bytes | None) -> None:
        if data is None:
            with contextlib.suppress(OSError):
                os.close(log.fd)
            return
        if log.error is not None:
            return
        try:
            write_all(log.fd, data)
        except OSError as exc:  # ENOSPC, EIO, EROFS...: the terminal copy still goes out
            log.error = exc
            self._failed.append(log)

    def failures(self) -> list[LogFile]:
        """Log files whose writes failed since the last call (each reported once)."""
        out = []
        while self._failed:
            out.append(self._failed.popleft())
        return out


class _LogQueue(_Queue):
    def __init__(self, sink: LogSink, on_drained: Callable[[], None] | None) -> None:
        self._sink = sink
        super().__init__("logs", on_drained)

    def write_batch(self, batch: list[object]) -> int:
        size = 0
        pending: dict[LogFile, list[bytes]] = {}
        for log, data in batch:  # type: ignore[misc]
            if data is None:  # a close: write what came before it first
                if log in pending:
                    self._sink.write(log, b"".join(pending.pop(log)))
                self._sink.write(log, None)
                continue
            pending.setdefault(log, []).append(data)
            size += len(data)
        for log, chunks in pending.items():
            self._sink.write(log, b"".join(chunks))
        return size

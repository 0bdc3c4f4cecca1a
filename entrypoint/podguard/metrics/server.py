"""The HTTP endpoint of `--metrics-port`: GET (or HEAD) /metrics, served by one thread of its own, never on
podguard's loop.

    server = MetricsServer.bind(9464, registry)   # UsageError (64) when the port is taken or cannot be bound
    server.close()                                 # the port is closed when this returns, whatever clients do

One selector loop over non-blocking sockets (docs/metrics.md, "The endpoint and bad clients"): a connection costs a
socket and a buffer, never a thread, so slow clients cannot use up what scrapes need.
- **A whole-request deadline**: every connection is closed DEADLINE_S after its accept, whether or not it still
  trickles bytes (a per-read timeout is no deadline: one byte every 5 s kept a connection for ever).
- **Slots that free themselves**: at most MAX_CONNECTIONS are open; one more closes the oldest. A scrape is answered
  in the pass in which its request arrives, so the oldest open connections are the slow ones, and a new scraper
  always gets in.
- Only `/metrics` (other paths 404), GET and HEAD (else 501), a request head of at most MAX_HEAD_BYTES (else 431);
  one request per connection (HTTP/1.0 answers). The body is prometheus_client's encoder: the text format 0.0.4, or
  OpenMetrics for a scraper that asks for it, gzip where accepted. `Server: podguard`, never a version.
Formatting is the only work a request does (metrics/exposition.py: one snapshot reference, no lock).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import selectors
import socket
import threading
import time
from email.utils import formatdate
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder, gzip_accepted

from podguard.errors import UsageError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["ADDRESS", "DEADLINE_S", "MAX_CONNECTIONS", "MAX_HEAD_BYTES", "SERVER", "MetricsServer"]

ADDRESS = "0.0.0.0"  # IPv4, every interface: RunPod's HTTP proxy reaches the pod's port there (docs/metrics.md)
PATH = "/metrics"
DEADLINE_S = 5.0  # a connection's whole life: its request read and its answer sent (a scrape takes milliseconds)
MAX_CONNECTIONS = 128  # open at once; one more closes the oldest (sockets, not threads: 128 cost nothing)
MAX_HEAD_BYTES = 8192  # a request line and headers larger than this are refused (431)
SERVER = "podguard"  # the Server header: no version of podguard, Python or anything else
LISTEN_BACKLOG = 128  # a burst of connections waits in the kernel, not for TCP's 1 s SYN retry
ACCEPT_PAUSE_S = 0.1  # out of file descriptors with none of our own to close: accepting pauses this long
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 431: "Request Header Fields Too Large"}
_REASONS |= {500: "Internal Server Error", 501: "Not Implemented", 505: "HTTP Version Not Supported"}


class MetricsServer:
    """`http://0.0.0.0:PORT/metrics` for the life of the run."""

    def __init__(
        self, listener: socket.socket, registry: CollectorRegistry, *, deadline_s: float, max_connections: int
    ) -> None:
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._registry = registry
        self._deadline_s = deadline_s
        self._max = max(1, max_connections)
        self._conns: dict[socket.socket, _Conn] = {}  # in accept order: the first is the oldest
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._accept_paused_until: float | None = None
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="podguard-metrics-http", daemon=True)
        self._thread.start()

    @classmethod
    def bind(
        cls,
        port: int,
        registry: CollectorRegistry,
        *,
        deadline_s: float = DEADLINE_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> MetricsServer:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # a port in TIME_WAIT from the last run binds again; one that another process listens on does not
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((ADDRESS, port))
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except OSError as exc:
            listener.close()
            raise UsageError(f"--metrics-port={port}: {_bind_error(port, exc)}") from None
        return cls(listener, registry, deadline_s=deadline_s, max_connections=max_connections)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def close(self) -> None:
        """Stop serving: every connection and the listening socket are closed (the port is free when this returns)."""
        if self._closed:
            return
        self._closed = self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():  # (never seen: the loop formats and sends, it does not block) close it anyway
            self._listener.close()
        self._wake_w.close()

    # -- the loop -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                events = self._selector.select(self._timeout(time.monotonic()))
                for key, _ in events:
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._serve(key.data)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()

    def _timeout(self, now: float) -> float | None:
        """Until the oldest connection's deadline (every connection has the same span, so the oldest's is the
        first) or the end of an accept pause; None (until something happens) when nothing waits."""
        waits = [next(iter(self._conns.values())).deadline] if self._conns else []
        if self._accept_paused_until is not None:
            waits.append(self._accept_paused_until)
        return max(0.0, min(waits) - now) if waits else None

    def _expire(self, now: float) -> None:
        while self._conns and (oldest := next(iter(self._conns.values()))).deadline <= now:
            self._drop(oldest)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _accept(self) -> None:
        for _ in range(self._max):  # (bounded: a flood of connections cannot keep this pass from serving others)
            try:
                sock, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._out_of_descriptors()
                return  # (ECONNABORTED and the like: that one is gone; the listener stays ready for the next)
            if len(self._conns) >= self._max:
                self._drop(next(iter(self._conns.values())))  # the oldest: a slow one (scrapes end in one pass)
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self._deadline_s)
            self._conns[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _out_of_descriptors(self) -> None:
        """The process has no file descriptor left for a new connection: close our oldest, or (none of ours) stop
        accepting for ACCEPT_PAUSE_S, so a listener that stays readable does not spin."""
        if self._conns:
            self._drop(next(iter(self._conns.values())))
        elif self._accept_paused_until is None:
            self._selector.unregister(self._listener)
            self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S

    def _serve(self, conn: _Conn) -> None:
        try:
            if conn.answer is None:
                self._read(conn)
            if conn.answer is not None:
                self._write(conn)
        except OSError:  # reset by the peer, a broken pipe: that client is gone
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        if not data:  # the client hung up before its request was whole
            self._drop(conn)
            return
        conn.head += data
        end = _head_end(conn.head)
        if end is None:
            if len(conn.head) > MAX_HEAD_BYTES:
                conn.answer = memoryview(_response(431, b"Request head too large\n", "text/plain; charset=utf-8"))
                self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        try:
            answer = self._answer(bytes(conn.head[:end]))
        except Exception:  # a collector's bug: this scrape is a 500, the endpoint goes on serving the next
            answer = _response(500, b"podguard could not format its metrics\n", "text/plain; charset=utf-8")
        conn.answer = memoryview(answer)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.answer is not None
        while conn.answer:
            try:
                sent = conn.sock.send(conn.answer)
            except BlockingIOError:
                return  # the client's window is full: the selector says when it reads again (or the deadline ends it)
            conn.answer = conn.answer[sent:]
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _answer(self, head: bytes) -> bytes:
        """The whole response to a request head (its request line and headers)."""
        request_line, headers = _parse_head(head)
        parts = request_line.split()
        if len(parts) != 3:
            return _response(400, b"Bad request\n", "text/plain; charset=utf-8")
        method, target, version = parts
        if not version.startswith("HTTP/1."):
            return _response(505, b"HTTP/1.x only\n", "text/plain; charset=utf-8")
        if method not in ("GET", "HEAD"):
            return _response(501, b"Only GET and HEAD\n", "text/plain; charset=utf-8", extra={"Allow": "GET, HEAD"})
        body = method == "GET"
        if urlsplit(target).path.rstrip("/") != PATH:
            text = b"Not found: podguard serves its metrics at /metrics\n"
            return _response(404, text, "text/plain; charset=utf-8", body=body)
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        data = encoder(self._registry)
        if gzip_accepted(headers.get("accept-encoding", "")):
            return _response(200, gzip.compress(data, 5), content_type, body=body, extra={"Content-Encoding": "gzip"})
        return _response(200, data, content_type, body=body)


class _Conn:
    __slots__ = ("answer", "deadline", "head", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.head = bytearray()
        self.answer: memoryview | None = None  # what is left to send, once the request was read


def _head_end(buf: bytearray) -> int | None:
    """Where the request head ends (a blank line: CRLF as HTTP says, or bare LF as lenient servers accept)."""
    ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else None


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").splitlines()
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return (lines[0] if lines else ""), headers


def _response(
    code: int, data: bytes, content_type: str, *, body: bool = True, extra: dict[str, str] | None = None
) -> bytes:
    headers = {
        "Server": SERVER,
        "Date": formatdate(usegmt=True),
        "Content-Type": content_type,
        "Content-Length": str(len(data)),
        **(extra or {}),
        "Connection": "close",
    }
    head = f"HTTP/1.0 {code} {_REASONS[code]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("latin-1") + (data if body else b"")


def _bind_error(port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is taken by another process; choose a free port (e.g. 9464)"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges here (ports below 1024 do); choose a port from 1024 to 65535"
    return f"cannot listen on {ADDRESS}:{port}: {exc.strerror or exc}"

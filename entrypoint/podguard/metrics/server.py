"""The HTTP endpoint of `--metrics-port`: GET (or HEAD) /metrics on threads of its own, never on podguard's loop.

    server = MetricsServer.bind(9464, registry)   # UsageError (64) when the port is taken or cannot be bound
    server.close()                                 # the port is closed when this returns, whatever clients do

The standard library's threading TCP server and HTTP handler, with prometheus_client's encoder for the body (the
text format 0.0.4, or OpenMetrics for a scraper that asks for it, gzip where accepted). prometheus_client's own
`start_http_server` is not used because of what it does not do (docs/metrics.md): it serves the metrics on every
path and refuses HEAD; a client that connects and never sends its request holds a thread for the life of the
process, and any number of them can. Here other paths are 404, HEAD answers the headers, a client that sends or
reads nothing for REQUEST_TIMEOUT_S is dropped, and at most MAX_CLIENTS connections are served at once (more are
closed at once). Handler threads are daemons that `close()` never waits for.
"""

from __future__ import annotations

import errno
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from podguard.errors import UsageError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["ADDRESS", "MAX_CLIENTS", "REQUEST_TIMEOUT_S", "MetricsServer"]

ADDRESS = "0.0.0.0"  # IPv4, every interface (PRODUCT.md): RunPod's proxy and a pod's public IP reach it
PATH = "/metrics"
REQUEST_TIMEOUT_S = 10.0  # a client silent this long (sending its request or reading the answer) is dropped
MAX_CLIENTS = 32  # connections served at once (Prometheus needs one; a few stuck ones leave room)
POLL_S = 0.1  # how soon close() stops the accept loop


class MetricsServer:
    """`http://0.0.0.0:PORT/metrics` for the life of the run."""

    def __init__(self, port: int, httpd: _Server, thread: threading.Thread) -> None:
        self.port = port
        self._httpd: _Server | None = httpd
        self._thread = thread

    @classmethod
    def bind(
        cls,
        port: int,
        registry: CollectorRegistry,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        max_clients: int = MAX_CLIENTS,
    ) -> MetricsServer:
        try:
            httpd = _Server((ADDRESS, port), registry, timeout_s, max_clients)
        except OSError as exc:
            raise UsageError(f"--metrics-port={port}: {_bind_error(port, exc)}") from None
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": POLL_S}, name="podguard-metrics-http", daemon=True
        )
        thread.start()
        return cls(port, httpd, thread)

    def close(self) -> None:
        """Stop serving and close the listening socket (the port is free again when this returns)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(timeout=5.0)


def _bind_error(port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is taken by another process; choose a free port (e.g. 9464)"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges here (ports below 1024 do); choose a port from 1024 to 65535"
    return f"cannot listen on {ADDRESS}:{port}: {exc.strerror or exc}"


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection, at most `max_clients` of them; none of them is waited for at close."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True  # a port in TIME_WAIT from the last run binds; one another process listens on does not
    request_queue_size = 64  # the listen backlog (socketserver's 5 makes a burst of connections wait 1 s for a retry)

    def __init__(self, address: tuple[str, int], registry: Any, timeout_s: float, max_clients: int) -> None:
        self.registry = registry
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_clients)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: this one is closed, the others go on
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer: nothing to tell (the default prints a traceback into the job's log)."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: nothing is kept open between scrapes

    def setup(self) -> None:
        self.timeout = self.server.timeout_s  # (StreamRequestHandler sets it on the socket)
        super().setup()

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        from prometheus_client.exposition import choose_encoder, gzip_accepted

        if urlsplit(self.path).path.rstrip("/") != PATH:
            self._send(404, b"Not found: podguard serves its metrics at /metrics\n", "text/plain; charset=utf-8", body)
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        data = encoder(self.server.registry)
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            import gzip

            self._send(200, gzip.compress(data), content_type, body, encoding="gzip")
        else:
            self._send(200, data, content_type, body)

    def _send(self, code: int, data: bytes, content_type: str, body: bool, encoding: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing per request in the job's log."""

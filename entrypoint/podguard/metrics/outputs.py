"""Where the metrics go: the HTTP endpoint (`--metrics-port`) and the textfile (`--metrics-file`).

    server = MetricsServer.bind(9464, registry)      # UsageError (64) when the port is taken or cannot be bound
    writer = FileWriter(path, registry, every_s=15)  # writes once now (64 when it cannot), then on its thread
    ...; writer.close(); server.close()              # the file keeps its last values; the port is closed

The server is prometheus_client's own (a daemon thread, one thread per request), so a scrape runs beside
podguard's loop, never on it. The file is replaced whole each time (write a hidden temporary file in the same
folder, then rename it over the old one), so node_exporter's textfile collector never reads half a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard.errors import UsageError
from podguard.metrics.exposition import render

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["FILE_INTERVAL_S", "FileWriter", "MetricsServer"]

FILE_INTERVAL_S = 15.0  # PRODUCT.md; PODGUARD_METRICS_INTERVAL changes it (tests, a faster collector)
ADDRESS = "0.0.0.0"


class MetricsServer:
    """`http://0.0.0.0:PORT/metrics` for the life of the run."""

    def __init__(self, port: int, httpd: Any, thread: threading.Thread) -> None:
        self.port = port
        self._httpd = httpd
        self._thread = thread

    @classmethod
    def bind(cls, port: int, registry: CollectorRegistry) -> MetricsServer:
        from prometheus_client.exposition import start_http_server

        try:
            httpd, thread = start_http_server(port, addr=ADDRESS, registry=registry)
        except OSError as exc:
            raise UsageError(f"--metrics-port={port}: {_bind_error(port, exc)}") from None
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


class FileWriter:
    """The textfile: written at once (so a bad path is 64 before the job), then every `every_s` on a daemon
    thread, and a last time at `close()`."""

    def __init__(self, path: Path, registry: CollectorRegistry, *, every_s: float = FILE_INTERVAL_S) -> None:
        self.path = path
        self._registry = registry
        self._every_s = every_s
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # the thread's write and close()'s last one never interleave
        self.writes = 0
        self.error: str | None = None  # the last write's failure (a full volume), kept for the record
        try:
            self.write()
        except OSError as exc:
            raise UsageError(
                f"--metrics-file={str(path)!r} cannot be written: {exc.strerror or exc}; give a path in a writable "
                "folder (node_exporter's --collector.textfile.directory, e.g. /var/lib/node_exporter/podguard.prom)"
            ) from None
        self._thread = threading.Thread(target=self._run, name="podguard-metrics-file", daemon=True)
        self._thread.start()

    def write(self) -> None:
        """Replace the file whole: a hidden temporary file beside it, then a rename (atomic on one filesystem)."""
        text = render(self._registry)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")  # (not *.prom: the collector skips it)
        with self._write_lock:
            try:
                with open(tmp, "wb") as fh:
                    fh.write(text)
                os.replace(tmp, self.path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
            self.writes += 1

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.write()
                self.error = None
            except OSError as exc:  # a full volume: try again next time; the job never fails for its metrics
                self.error = exc.strerror or str(exc)

    def close(self) -> None:
        """Stop the thread and write the last values (best effort)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        with contextlib.suppress(OSError):
            self.write()

"""A real S3 server on loopback for the store's tests: moto's server (`moto[server]`) in its own process, and a
TCP relay in front of it that a test can take down and bring back (the store going away mid-run).

    server = S3Server.start()                 # moto_server on 127.0.0.1:<free port>
    server.bucket("run1")                     # a new bucket
    relay = Relay(server.port); relay.down(); relay.up()
    env = store_env(server.url)               # AWS_* for podguard's processes: the endpoint, test credentials
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time

from loopback import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIAPODGUARDTEST0001", "AWS_SECRET_ACCESS_KEY": "podguard-test-secret-value"}


def store_env(endpoint: str, **extra: str) -> dict[str, str]:
    """What podguard's processes need to reach the test server fast: its endpoint, test credentials, short
    retries and backoff, 5 MiB parts (S3's smallest) so that a 12 MB file is a multipart upload."""
    return {
        **CREDENTIALS,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_MAX_ATTEMPTS": "2",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "PODGUARD_STORE_BACKOFF_MAX": "0.5",
        "PODGUARD_STORE_PART_BYTES": str(5 * 2**20),
        **extra,
    }


class S3Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def start(cls, env: dict[str, str] | None = None) -> S3Server:
        port = free_port()
        code = "from moto.server import main; main()"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return cls(proc, port)
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}")
            time.sleep(0.1)
        proc.kill()
        raise RuntimeError("moto_server did not listen within 60 s")

    def client(self, endpoint: str | None = None):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.url,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", ()):
                out[obj["Key"]] = obj["Size"]
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Relay:
    """TCP on 127.0.0.1:<port> relayed to the server; `down()` drops every connection and refuses new ones (they
    are accepted and closed at once), `up()` relays again. Stops with `close()`."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._up = threading.Event()
        self._up.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.refused = 0
        self._bad_gateway = False
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self) -> None:
        self._up.clear()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def up(self) -> None:
        self._bad_gateway = False
        self._up.set()

    def bad_gateway(self) -> None:
        """Answer every request 502 Bad Gateway (RunPod's S3 API under load) until `up()`."""
        self._bad_gateway = True
        self._up.clear()

    def close(self) -> None:
        self._closed.set()
        self.down()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                self.refused += 1
                if self._bad_gateway:
                    threading.Thread(target=self._answer_502, args=(conn,), daemon=True).start()
                else:
                    conn.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._pairs.append((conn, upstream))
            threading.Thread(target=self._pump, args=(conn, upstream), daemon=True).start()

    @staticmethod
    def _answer_502(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            body = b"<html><body>502 Bad Gateway</body></html>"
            conn.sendall(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

"""A local webhook (Slack/Discord-like) that records what `--notify` posts.

with Hook(delay_s=0.5) as hook:     # each answer comes `delay_s` after the post (a slow webhook)
    ... hook.url ...
    hook.bodies     # the JSON objects posted, in order
    hook.answered   # time.monotonic() of each answer, in the same order
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.answered: list[float] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if delay_s:
                    time.sleep(delay_s)
                hook.headers.append(dict(self.headers.items()))
                hook.bodies.append(json.loads(raw))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                self.wfile.flush()
                hook.answered.append(time.monotonic())

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/services/T000/B000/secret-path"

    def __enter__(self) -> Hook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

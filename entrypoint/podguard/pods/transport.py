"""A small HTTP client over the standard library for RunPod's REST v2 (JSON in, JSON or SSE out).

    t = Transport("https://api.runpod.io", key, timeout_s=30)
    body = t.request("GET", "/v2/pods")                       # decoded JSON, or ApiError
    with t.stream("/v2/pods/abc/logs", {"tail": 100}) as s:   # Server-Sent Events
        for event in s.events(): ...

Every failure becomes an `ApiError` with a retry decision: problem+json answers by status, an HTML page
(a proxy's 502) or an unreadable body as TRANSIENT, a dropped connection or timeout as TRANSIENT, 429
with its Retry-After. The key travels only in the Authorization header and is scrubbed from any text the
server sends back before it reaches a message.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from podguard import __version__
from podguard.pods.auth import ApiKey, key_hint
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.sse import SseEvent, parse_sse
from podguard.redact import redact_text

__all__ = ["Stream", "Transport", "error_from_answer", "path_of"]

_CAPACITY = re.compile(
    r"(?i)not enough free gpus|no longer any instances|no (available )?capacity|insufficient capacity|"
    r"could not be placed|out of stock|no instances available|unavailable"
)


def path_of(*segments: str) -> str:
    """`/v2/pods/<id>` with each segment percent-encoded (ids and names are user input)."""
    return "/" + "/".join(quote(s, safe="") for s in segments)


class Transport:
    """One keep-alive connection for requests; a separate one per log stream. Thread-safe requests."""

    def __init__(self, base_url: str, key: ApiKey, *, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self._secure = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._key = key
        self._timeout = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    @property
    def key(self) -> ApiKey:
        return self._key

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._secure:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self._key.value}",
            "Accept": "application/json, application/problem+json",
            "User-Agent": f"podguard/{__version__}",
        }
        headers.update(extra or {})
        return headers

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None) -> Any:
        """Send one request; the decoded JSON answer (None for 204), or ApiError."""
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        what = f"{method} {path}"
        payload = None if body is None else json.dumps(body).encode()
        headers = self._headers({"Content-Type": "application/json"} if payload is not None else None)
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect(self._timeout)
                self._conn.request(method, target, body=payload, headers=headers)
                resp = self._conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise _transport_error(what, exc) from None
            if resp.getheader("Connection", "").lower() == "close":
                self._drop()
        if 200 <= resp.status < 300:
            if not raw.strip():
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: the answer was not JSON", status=resp.status) from None
        raise error_from_answer(what, resp.status, dict(resp.getheaders()), raw, self._key)

    def stream(self, path: str, query: Mapping[str, Any] | None = None, *, last_event_id: str = "") -> Stream:
        """Open a Server-Sent Events stream (its own connection); ApiError if the answer is not a stream."""
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        what = f"GET {path}"
        extra = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if last_event_id:
            extra["Last-Event-ID"] = last_event_id
        conn = self._connect(self._timeout)
        try:
            conn.request("GET", target, headers=self._headers(extra))
            sock = conn.sock  # getresponse() hands the socket to the answer and forgets it
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise _transport_error(what, exc) from None
        if resp.status != 200:
            raw = _read_quietly(resp)
            conn.close()
            raise error_from_answer(what, resp.status, dict(resp.getheaders()), raw, self._key)
        return Stream(conn, sock, resp, what)

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop()


class Stream:
    """An open SSE answer. `events()` yields until the server closes it; `close()` ends it from any thread."""

    def __init__(
        self, conn: http.client.HTTPConnection, sock: socket.socket | None, resp: http.client.HTTPResponse, what: str
    ) -> None:
        self._conn = conn
        self._sock = sock
        self._resp = resp
        self._what = what
        self._closed = False

    def set_idle_timeout(self, seconds: float) -> None:
        """A stream silent this long raises (ApiError TRANSIENT) so that the caller reopens it."""
        if self._sock is not None:
            self._sock.settimeout(seconds)

    def events(self) -> Iterator[SseEvent]:
        """Events as they arrive; ApiError(TRANSIENT) when the connection drops or goes silent too long."""
        try:
            for event in parse_sse(iter(self._resp.readline, b"")):
                if self._closed:
                    return
                yield event
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
            if self._closed:
                return
            raise _transport_error(self._what, exc) from None
        finally:  # the reading thread releases the answer; close() from elsewhere only shuts the socket
            with contextlib.suppress(OSError, AttributeError):
                self._resp.close()
            self._conn.close()

    def close(self) -> None:
        """End the stream from any thread: a blocked read returns at once."""
        self._closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_quietly(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read(65536)
    except (OSError, http.client.HTTPException):
        return b""


def _transport_error(what: str, exc: BaseException) -> ApiError:
    if isinstance(exc, TimeoutError | socket.timeout):
        reason = "no answer in time"
    elif isinstance(exc, ConnectionRefusedError):
        reason = "connection refused"
    elif isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError | http.client.IncompleteRead):
        reason = "the connection dropped before the answer came"
    else:
        reason = f"{type(exc).__name__}"
    return ApiError(ApiErrorKind.TRANSIENT, f"{what}: {reason}")


def _retry_after(headers: Mapping[str, str]) -> float | None:
    raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)  # RunPod sends whole seconds; fractions are accepted
        return max(seconds, 0.0) if seconds == seconds else None  # NaN is no answer
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(raw).timestamp() - time.time(), 0.0)  # an HTTP date
    except (TypeError, ValueError):
        return None


def error_from_answer(what: str, status: int, headers: Mapping[str, str], raw: bytes, key: ApiKey) -> ApiError:
    """Map a non-2xx answer to an ApiError (problem+json read when present; HTML pages are TRANSIENT)."""
    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "").lower()
    detail, is_json = "", False
    if "json" in ctype:
        try:
            problem = json.loads(raw)
            is_json = isinstance(problem, dict)
        except ValueError:
            problem = None
        if is_json:
            assert isinstance(problem, dict)
            parts = [str(problem.get("detail") or problem.get("title") or "")]
            parts += [str(e) for e in problem.get("errors") or [] if e]
            detail = "; ".join(p for p in parts if p)
    detail = redact_text(key.scrub(detail))[:500]
    shown = f"HTTP {status}" + (f": {detail}" if detail else "" if is_json else " (not an API answer: an error page)")
    message = f"{what}: {shown}"
    if status == 401:
        source = key.source
        return ApiError(
            ApiErrorKind.AUTH, f"RunPod rejected the API key from {source} (HTTP 401); {key_hint()}", status=status
        )
    if status == 402:
        return ApiError(ApiErrorKind.NO_BALANCE, f"{message} (the account has no balance left)", status=status)
    if status == 403:
        return ApiError(ApiErrorKind.FORBIDDEN, f"{message} (the API key may not do this)", status=status)
    if status == 429:
        return ApiError(ApiErrorKind.RATE_LIMITED, message, status=status, retry_after=_retry_after(headers))
    if status == 413:  # the body is over the API's limit (also when a proxy answers it as a page): never retried
        return ApiError(ApiErrorKind.INVALID, message, status=status, detail=detail)
    if status >= 500 or not is_json:
        return ApiError(ApiErrorKind.TRANSIENT, message, status=status)
    kinds = {404: ApiErrorKind.NOT_FOUND, 409: ApiErrorKind.CONFLICT}
    if status in kinds:
        return ApiError(kinds[status], message, status=status, detail=detail)
    if status == 400:
        kind = ApiErrorKind.NO_CAPACITY if _CAPACITY.search(detail) else ApiErrorKind.REJECTED
        return ApiError(kind, message, status=status, detail=detail)
    return ApiError(ApiErrorKind.INVALID, message, status=status, detail=detail)

"""A stateful stand-in of the RunPod API on a local port: the REST v2 subset podguard uses and the GraphQL
subset the `runpod` SDK sends, with scripted faults and a log of every request.

    api = StandIn(key="rpa_...").start()        # api.url -> RUNPOD_API_BASE_URL
    api.fault("POST", r"^/v2/pods$", "lost")    # do it, then drop the connection before answering
    api.requests                                # [Recorded(method, target, headers, body, at)]

Faults: "html502" (a proxy's HTML page), "429" (problem+json, Retry-After), "500" (problem+json),
"400"/"403"/"409" (a refusal as problem+json, nothing done), "slow" (answer after `delay`), "drop" (close without
answering), "lost" (do it, then drop the answer), "late" (drop the connection at once, and do it `delay` seconds
later: a create or a start that lands after the client gave up).
Log streams (SSE) backfill by `tail`/`since`/`Last-Event-ID`, then stay open with keep-alive comments.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from standin_gqlapi import handle_graphql
from standin_state import Refusal, Timing, World

_CREATE_FIELDS = {
    "name",
    "image",
    "args",
    "disk",
    "ports",
    "env",
    "cloud",
    "dataCenterIds",
    "startSsh",
    "mounts",
    "gpu",
    "cpu",
    "registry",
    "templateId",
    "globalNetworking",
    "startJupyter",
}


_CLUSTER_FIELDS = {
    "name",
    "type",
    "compute",
    "image",
    "args",
    "disk",
    "ports",
    "env",
    "dataCenterIds",
    "mounts",
    "startJupyter",
    "startSsh",
}
_CLUSTER_TYPES = ("APPLICATION", "TRAINING", "SLURM", "RAY")


@dataclass
class Recorded:
    method: str
    target: str  # path and query, as sent
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    kind: str
    times: int = 1
    retry_after: str = "0.05"
    delay: float = 0.0
    body_contains: str = ""


class StandIn:
    def __init__(self, key: str, timing: Timing | None = None) -> None:
        self.key = key
        self.world = World(timing)
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="standin-http", daemon=True
        )
        self.closing = threading.Event()
        self.cuts = 0  # bumped by cut_streams(): open log streams end (as a proxy cutting them would)
        self.landed: list[tuple[str, str, float]] = []  # (method, path, when) of each "late" request that landed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> StandIn:
        self.world.start()
        self._thread.start()
        return self

    def close(self) -> None:
        self.closing.set()
        self.world.close()
        self._server.shutdown()
        self._server.server_close()

    def cut_streams(self) -> None:
        with self.world.lock:
            self.cuts += 1
            self.world.lock.notify_all()

    def fault(self, method: str, path: str, kind: str, *, times: int = 1, **kw: Any) -> Fault:
        f = Fault(method, re.compile(path), kind, times, **kw)
        with self._lock:
            self.faults.append(f)
        return f

    def late(self, handler: _Handler, path: str, body: bytes, delay: float) -> None:
        """Do what `handler`'s request asks `delay` seconds from now (its client got no answer): a late landing."""
        command = handler.command

        def land() -> None:
            if self.closing.is_set():
                return
            shadow = _Handler.__new__(_Handler)
            shadow.command, shadow.path, shadow.api = command, handler.path, self  # type: ignore[misc]
            try:
                shadow._route(path, body, answer=False)
            except Exception:  # the world changed meanwhile (the pod is gone): nothing lands
                return
            self.landed.append((command, path, time.monotonic()))

        timer = threading.Timer(delay, land)
        timer.daemon = True
        timer.start()

    def take_fault(self, method: str, path: str, body: bytes) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and f.path.search(path) and f.body_contains.encode() in body:
                    f.times -= 1
                    return f
        return None

    def record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        with self._lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method) and (path is None or re.search(path, r.path))
            ]


def _handler_for(standin: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        api = standin

    return Handler


class _Handler(BaseHTTPRequestHandler):
    api: StandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing ------------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.api.record(Recorded(self.command, self.path, dict(self.headers.items()), body))
        path = urlsplit(self.path).path
        fault = self.api.take_fault(self.command, path, body)
        if fault is not None and fault.kind == "slow":
            time.sleep(fault.delay)
        elif fault is not None and fault.kind == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        elif fault is not None and fault.kind in ("html502", "429", "500", "400", "403", "409"):
            self._fault_answer(fault)
            return
        if self.headers.get("Authorization") != f"Bearer {self.api.key}":
            self._problem(401, "Unauthorized", "missing or invalid bearer token")
            return
        if fault is not None and fault.kind == "lost":
            self._route(path, body, answer=False)
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if fault is not None and fault.kind == "late":
            self.api.late(self, path, body, fault.delay)
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self._route(path, body, answer=True)

    do_GET = do_POST = do_PATCH = do_DELETE = _dispatch

    def _fault_answer(self, fault: Fault) -> None:
        if fault.kind == "html502":
            page = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
            self._send(502, page, "text/html")
        elif fault.kind == "429":
            self._problem(
                429,
                "Too Many Requests",
                "rate limit exceeded for the minute window",
                headers={"Retry-After": fault.retry_after},
            )
        elif fault.kind == "400":
            self._problem(400, "Bad Request", "request could not be processed")
        elif fault.kind == "403":
            self._problem(403, "Forbidden", "access denied")
        elif fault.kind == "409":
            self._problem(409, "Conflict", "the pod is changing state; try again")
        else:
            self._problem(500, "Internal Server Error", "upstream failure")

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _problem(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        errors: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
        if errors:
            body["errors"] = errors
        self._send(status, json.dumps(body).encode(), "application/problem+json", headers)

    # -- routes --------------------------------------------------------------------------------------------
    def _route(self, path: str, body: bytes, *, answer: bool) -> None:
        world = self.api.world
        try:
            if path == "/graphql" and self.command == "POST":
                status, data = handle_graphql(world, body)
            else:
                status, data = self._rest(world, path, body)
        except Refusal as exc:
            if answer:
                titles = {
                    400: "Bad Request",
                    402: "Payment Required",
                    404: "Not Found",
                    409: "Conflict",
                    413: "Content Too Large",
                    422: "Unprocessable Entity",
                }
                self._problem(exc.status, titles.get(exc.status, "Error"), exc.detail, errors=exc.errors)
            return
        if not answer:
            return
        if status == "sse":
            self._stream(data)
        elif status == 204:
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._json(status, data)

    def _rest(self, world: World, path: str, body: bytes) -> tuple[Any, Any]:
        from standin_views import pod_view, template_view

        parts = [unquote(p) for p in path.strip("/").split("/")]
        method = self.command
        if method == "POST" and len(body) > world.max_body:
            raise Refusal(413, f"request body of {len(body)} bytes is over the {world.max_body} byte limit")
        with world.lock:
            if parts[:2] == ["v2", "clusters"]:
                return self._clusters(world, parts, body)
            if parts == ["v2", "pods"] and method == "GET":
                return 200, _pods_list(world, parse_qs(urlsplit(self.path).query, keep_blank_values=True))
            if parts == ["v2", "pods"] and method == "POST":
                return 201, pod_view(world.create(_create_body(body)))
            if len(parts) == 3 and parts[:2] == ["v2", "pods"]:
                if method == "GET":
                    return 200, pod_view(world.get(parts[2]))
                if method == "DELETE":
                    world.act(parts[2], "terminate")
                    return 204, None
            if len(parts) == 4 and parts[:2] == ["v2", "pods"] and parts[3] == "action" and method == "POST":
                action = json.loads(body or b"{}").get("action")
                if action not in ("start", "stop", "restart", "terminate"):
                    raise Refusal(422, "invalid action", [f"$.action: {action!r} is not one of the allowed"])
                pod = world.act(parts[2], action)
                return (204, None) if pod is None else (200, pod_view(pod))
            if len(parts) == 4 and parts[:2] == ["v2", "pods"] and parts[3] == "logs" and method == "GET":
                world.get(parts[2])
                return "sse", parts[2]
            if parts == ["v2", "templates"] and method == "GET":
                return 200, {"templates": [template_view(t) for t in world.templates.values()]}
            if parts == ["v2", "templates"] and method == "POST":
                data = json.loads(body)
                if any(t.get("name") == data.get("name") for t in world.templates.values()):
                    raise Refusal(400, f"a template named {data.get('name')!r} exists already")
                tid = world.new_template_id()
                world.templates[tid] = {**data, "id": tid}
                return 201, template_view(world.templates[tid])
            if len(parts) == 3 and parts[:2] == ["v2", "templates"]:
                if parts[2] not in world.templates:
                    raise Refusal(404, "template not found")
                if method == "GET":
                    return 200, template_view(world.templates[parts[2]])
                if method == "PATCH":
                    world.templates[parts[2]].update(json.loads(body))  # env: replaced whole (PATCH semantics)
                    return 200, template_view(world.templates[parts[2]])
                if method == "DELETE":
                    del world.templates[parts[2]]
                    return 204, None
        raise Refusal(404, f"no route {method} {path}")

    def _clusters(self, world: World, parts: list[str], body: bytes) -> tuple[Any, Any]:
        """`/v2/clusters[/{id}[/pods]]`: list, create, get, delete, members (no start/stop/restart)."""
        from standin_views import cluster_view, pod_view

        method = self.command
        if len(parts) == 2 and method == "GET":
            return 200, {"clusters": [cluster_view(world, c) for c in world.clusters.values()]}
        if len(parts) == 2 and method == "POST":
            return 201, cluster_view(world, world.create_cluster(_cluster_body(body)))
        if len(parts) == 3 and method == "GET":
            return 200, cluster_view(world, world.get_cluster(parts[2]))
        if len(parts) == 3 and method == "DELETE":
            world.delete_cluster(parts[2])
            return 204, None
        if len(parts) == 4 and parts[3] == "pods" and method == "GET":
            return 200, {"pods": [pod_view(p) for p in world.members(world.get_cluster(parts[2]))]}
        raise Refusal(404, f"no route {method} /{'/'.join(parts)}")

    def _stream(self, pod_id: str) -> None:
        """SSE: backfill (Last-Event-ID > since > tail), then live lines and keep-alives until closed."""
        world = self.api.world
        query = parse_qs(urlsplit(self.path).query)
        source = (query.get("source") or [None])[0]
        with world.lock:
            logs = [e for e in world.pods[pod_id].logs if source is None or e.source == source]
            last_id = self.headers.get("Last-Event-ID")
            if last_id:
                seq = int(last_id.rsplit("/", 1)[-1])
                start = next((i for i, e in enumerate(logs) if e.seq > seq), len(logs))
            elif query.get("since"):
                start = next((i for i, e in enumerate(logs) if e.ts >= query["since"][0]), len(logs))
            else:
                start = max(len(logs) - int((query.get("tail") or ["100"])[0]), 0)
            sent = logs[start - 1].seq if start > 0 else 0
        self.send_response(200)
        for k, v in (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Connection", "close")):
            self.send_header(k, v)
        self.end_headers()
        self.close_connection = True
        keepalive = world.timing.keepalive_s
        next_ping = time.monotonic() + keepalive
        cut = self.api.cuts
        try:
            while not self.api.closing.is_set() and self.api.cuts == cut:
                with world.lock:
                    pod = world.pods[pod_id]
                    fresh = [e for e in pod.logs if e.seq > sent and (source is None or e.source == source)]
                    if not fresh:
                        world.lock.wait(min(0.05, keepalive))
                        if self.api.cuts != cut:
                            return
                        fresh = [e for e in pod.logs if e.seq > sent and (source is None or e.source == source)]
                for e in fresh:
                    data = json.dumps({"ts": e.ts, "source": e.source, "line": e.line})
                    self.wfile.write(f"id: {e.event_id}\ndata: {data}\n\n".encode())
                    sent = e.seq
                if time.monotonic() >= next_ping:
                    self.wfile.write(b": keep-alive\n\n")
                    next_ping = time.monotonic() + keepalive
                self.wfile.flush()
        except OSError:
            return


def _pods_list(world: World, query: dict[str, list[str]]) -> dict[str, Any]:
    """`GET /v2/pods` as RunPod's published spec has it (Frontdoor v2.9.0, `listPods`): every pod in one
    `{"pods": [...]}`, no pagination; the only query parameter is `includeClusterPods` (a boolean). Anything
    else is refused (422), so a client that invents parameters (`limit`, `cursor`) fails here."""
    from standin_views import pod_view

    unknown = sorted(set(query) - {"includeClusterPods"})
    if unknown:
        raise Refusal(422, "Request validation failed.", [f"$.query: unknown parameter '{u}'" for u in unknown])
    raw = (query.get("includeClusterPods") or ["false"])[-1]
    if raw not in ("true", "false"):
        raise Refusal(422, "Request validation failed.", [f"$.includeClusterPods: {raw!r} is not a boolean"])
    return {
        "pods": [
            pod_view(p)
            for p in reversed(list(world.pods.values()))
            if p.status != "TERMINATED" and (raw == "true" or p.cluster_id is None)
        ]
    }


def _cluster_body(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    unknown = sorted(set(body) - _CLUSTER_FIELDS)
    if unknown:
        raise Refusal(
            422, "Request validation failed.", [f"$: additional properties '{u}' not allowed" for u in unknown]
        )
    missing = [k for k in ("name", "type", "compute", "image") if not body.get(k)]
    if missing:
        raise Refusal(422, "Request validation failed.", [f"$: missing property '{m}'" for m in missing])
    compute = body["compute"]
    if not isinstance(compute, dict) or set(compute) != {"gpuTypeId", "gpuCountPerPod", "podCount"}:
        raise Refusal(422, "Request validation failed.", ["$.compute: gpuTypeId, gpuCountPerPod, podCount"])
    if not 2 <= int(compute["podCount"]) <= 250 or int(compute["gpuCountPerPod"]) < 1:
        raise Refusal(422, "Request validation failed.", ["$.compute.podCount: 2..250"])
    if body["type"] not in _CLUSTER_TYPES:
        raise Refusal(422, "Request validation failed.", [f"$.type: {body['type']!r} is not a ClusterType"])
    return body


def _create_body(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    unknown = sorted(set(body) - _CREATE_FIELDS)
    if unknown:
        raise Refusal(
            422, "Request validation failed.", [f"$: additional properties '{u}' not allowed" for u in unknown]
        )
    missing = [k for k in ("name", "image") if not body.get(k)]
    if missing:
        raise Refusal(422, "Request validation failed.", [f"$: missing property '{m}'" for m in missing])
    if ("gpu" in body) == ("cpu" in body):
        raise Refusal(400, "exactly one of gpu or cpu must be set")
    if not isinstance(body.get("env", {}), dict):
        raise Refusal(422, "Request validation failed.", ["$.env: expected object"])
    return body

"""`PodApi` over RunPod's REST v2 (`$RUNPOD_API_BASE_URL/v2`), with the stdlib transport.

    api = RestApi("https://api.runpod.io", key, policy=RetryPolicy(), timeout_s=30, stream_idle_s=120)
    api.act(pod.id, PodAction.STOP)

Part of the core install: self-heal uses it from inside a pod, so it imports nothing outside the stdlib
and podguard. REST v2 has no spot field: interruptible pods are created through graphql_api.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from podguard.errors import UsageError
from podguard.pods.auth import ApiKey
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.pod import (
    ApiKind,
    CpuInfo,
    GpuInfo,
    LogEvent,
    Pod,
    PodAction,
    PodRequest,
    PodStatus,
    PortInfo,
    TemplateRequest,
    Volume,
)
from podguard.pods.retry import RetryPolicy, with_retry
from podguard.pods.transport import Stream, Transport, path_of

__all__ = [
    "RestApi",
    "answer_field",
    "mounts_body",
    "parse_answer",
    "pod_from_rest",
    "rest_create_body",
    "too_large",
]


class RestApi:
    kind = ApiKind.REST

    def __init__(
        self, base_url: str, key: ApiKey, *, policy: RetryPolicy, timeout_s: float, stream_idle_s: float
    ) -> None:
        self.policy = policy
        self.transport = Transport(base_url, key, timeout_s=timeout_s)
        self._stream_idle_s = stream_idle_s

    def call(self, what: str, method: str, path: str, **kw: Any) -> Any:
        """One idempotent request, transient failures retried within the policy (the clusters client uses it)."""
        return with_retry(lambda: self.transport.request(method, path, **kw), self.policy, what=what)

    def list_pods(self) -> list[Pod]:
        return [parse_answer(pod_from_rest, p, "list pods") for p in self.list_pod_objects()]

    def list_pod_objects(self, *, include_cluster_pods: bool = False) -> list[dict[str, Any]]:
        """Every pod object of the account: one `GET /v2/pods`, which answers all of them in one `{"pods": [...]}`.

        RunPod's published spec (Frontdoor v2.9.0) documents no pagination and one query parameter,
        `includeClusterPods` (cluster members are hidden without it); nothing else is sent (docs/pods.md)."""
        query = {"includeClusterPods": "true"} if include_cluster_pods else None
        body = self.call("list pods", "GET", "/v2/pods", query=query)
        return [p for p in answer_field(body, "pods", "list pods") if isinstance(p, dict)]

    def get_pod(self, pod_id: str) -> Pod:
        return parse_answer(
            pod_from_rest, self.call(f"get pod {pod_id}", "GET", path_of("v2", "pods", pod_id)), "get pod"
        )

    def create_pod(self, request: PodRequest) -> Pod:
        payload = rest_create_body(request)
        try:
            body = self.transport.request("POST", "/v2/pods", body=payload)
        except ApiError as exc:
            raise too_large(exc, payload, "pod") from None
        return parse_answer(pod_from_rest, body, "create pod")

    def act_once(self, pod_id: str, action: PodAction) -> None:
        """One attempt of `action`, not retried: the caller retries, and knows each attempt (a keeper leases each
        start it sends: one whose answer was lost may still land)."""
        if action is PodAction.TERMINATE:
            self.transport.request("DELETE", path_of("v2", "pods", pod_id))
            return
        self.transport.request("POST", path_of("v2", "pods", pod_id, "action"), body={"action": str(action)})

    def act(self, pod_id: str, action: PodAction) -> Pod | None:
        what = f"{action} pod {pod_id}"
        if action is PodAction.TERMINATE:
            self.call(what, "DELETE", path_of("v2", "pods", pod_id))
            return None
        body = self.call(what, "POST", path_of("v2", "pods", pod_id, "action"), body={"action": str(action)})
        return None if body is None else parse_answer(pod_from_rest, body, what)

    def open_logs(
        self, pod_id: str, *, since: str | None, tail: int | None, last_event_id: str = "", source: str | None = None
    ) -> RestLogStream:
        query: dict[str, Any] = {}
        if since:
            query["since"] = since
        if tail is not None:
            query["tail"] = tail
        if source:
            query["source"] = source
        stream = with_retry(
            lambda: self.transport.stream(path_of("v2", "pods", pod_id, "logs"), query, last_event_id=last_event_id),
            self.policy,
            what=f"logs of pod {pod_id}",
        )
        stream.set_idle_timeout(self._stream_idle_s)
        return RestLogStream(stream)

    def upsert_template(self, request: TemplateRequest) -> tuple[str, bool]:
        body = rest_template_body(request)
        existing = self._template_named(request.name)
        if existing is not None:
            tid = str(existing["id"])
            self.call(f"update template {tid}", "PATCH", path_of("v2", "templates", tid), body=body)
            return tid, False
        created = with_retry(
            lambda: self.transport.request("POST", "/v2/templates", body=body),
            self.policy,
            what="create template",
            before_retry=lambda _err: self._template_named(request.name),  # a lost answer may have created it
        )
        return str(answer_field(created, "id", "create template")), True

    def _template_named(self, name: str) -> dict[str, Any] | None:
        listed = answer_field(self.call("list templates", "GET", "/v2/templates"), "templates", "list templates")
        return next((t for t in listed if isinstance(t, dict) and t.get("name") == name), None)


class RestLogStream:
    """Log events from an SSE answer: `data` is `{"ts", "source", "line"}`, `id` the resume cursor."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[LogEvent]:
        for event in self._stream.events():
            try:
                data = json.loads(event.data)
            except ValueError:
                data = None
            if isinstance(data, dict):
                yield LogEvent(
                    str(data.get("line", "")), str(data.get("ts", "")), str(data.get("source", "")), event.id
                )
            else:
                yield LogEvent(event.data, id=event.id)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> RestLogStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def too_large(error: ApiError, payload: dict[str, Any], what: str) -> ApiError:
    """A 413 (create body over RunPod's 100 KB) as one line that names what made it large; others as they are."""
    if error.status != 413:
        return error
    size = len(json.dumps(payload).encode())
    env = len(json.dumps(payload.get("env") or {}).encode())
    args = len(str(payload.get("args") or "").encode())
    return ApiError(
        ApiErrorKind.INVALID,
        f"create {what}: RunPod refused the request body ({size / 1024:.1f} KB, HTTP 413; the limit is 100 KB): "
        f"env {env / 1024:.1f} KB in {len(payload.get('env') or {})} variables, args {args / 1024:.1f} KB; "
        "move large values to a network volume or a RunPod secret",
        status=413,
    )


def answer_field(body: Any, name: str, what: str) -> Any:
    """`body[name]`, or ApiError TRANSIENT when the answer does not have it."""
    if not isinstance(body, dict) or name not in body:
        raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: unexpected answer (no {name!r})")
    return body[name]


def parse_answer(parse: Any, body: Any, what: str) -> Any:
    """`parse(body)`, an answer of an unexpected shape becoming ApiError TRANSIENT."""
    try:
        return parse(body)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: unexpected answer ({type(exc).__name__}: {exc})") from None


def _status(raw: Any) -> PodStatus:
    """RunPod's status; one its spec does not list (`RESTARTING` for a moment) or none at all is UNKNOWN: a caller
    reads again, it never takes it for ERROR."""
    try:
        status = PodStatus(str(raw).upper()) if raw is not None else PodStatus.UNKNOWN
    except ValueError:
        return PodStatus.UNKNOWN
    return status


def _ssh(ssh: Any) -> str | None:
    if not isinstance(ssh, dict):
        return None
    for variant in ("direct", "proxy"):
        endpoint = ssh.get(variant)
        if isinstance(endpoint, dict) and endpoint.get("command"):
            return str(endpoint["command"])
    return None


def _volume(mounts: Any) -> Volume | None:
    if not isinstance(mounts, dict):
        return None
    network = mounts.get("network") or []
    if network:
        return Volume(path=str(network[0]["path"]), volume_id=str(network[0]["volumeId"]))
    persistent = mounts.get("persistent")
    if isinstance(persistent, dict):
        return Volume(path=str(persistent["path"]), size_gb=int(persistent["size"]))
    return None


def pod_from_rest(d: dict[str, Any]) -> Pod:
    """A REST v2 pod object as a `Pod`."""
    gpu = d.get("gpu")
    cpu = d.get("cpu")
    runtime = d.get("runtime") or {}
    cluster = d.get("cluster") if isinstance(d.get("cluster"), dict) else {}
    rank = cluster.get("rank")
    ports = tuple(
        PortInfo(int(p["private"]), p.get("public"), str(p.get("type", "")), p.get("ip"))
        for p in runtime.get("ports") or []
    )
    return Pod(
        id=str(d["id"]),
        name=str(d.get("name", "")),
        status=_status(d.get("status")),
        gpu=GpuInfo(str(gpu["id"]), int(gpu.get("count", 1))) if isinstance(gpu, dict) else None,
        cost_per_hr=None if d.get("cost") is None else float(d["cost"]),
        ssh=_ssh(d.get("ssh")),
        ports=ports,
        actions=tuple(PodAction(a) for a in d.get("actions") or [] if a in PodAction._value2member_map_),
        image=str(d.get("image", "")),
        args=str(d.get("args") or ""),
        env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
        port_specs=tuple(str(p) for p in d.get("ports") or []),
        disk_gb=d.get("disk"),
        cloud=d.get("cloud"),
        data_center=d.get("dataCenterId"),
        volume=_volume(d.get("mounts")),
        cpu=CpuInfo(str(cpu["id"]), int(cpu.get("vcpuCount", 0))) if isinstance(cpu, dict) else None,
        started_at=d.get("startedAt"),
        created_at=d.get("createdAt"),
        cluster_id=str(cluster["id"]) if cluster.get("id") else None,
        cluster_rank=None if rank is None else int(rank),
        has_runtime=isinstance(d.get("runtime"), dict),
        container_uptime_s=_uptime(d.get("runtime")),
        status_text=str(d.get("status") or ""),
    )


def _uptime(runtime: Any) -> int | None:
    if not isinstance(runtime, dict) or not isinstance(runtime.get("uptime"), int | float):
        return None
    return int(runtime["uptime"])


def mounts_body(volume: Volume | None) -> dict[str, Any] | None:
    """The REST v2 `mounts` of a volume (network or persistent), None without one."""
    if volume is None:
        return None
    if volume.network:
        return {"network": [{"volumeId": volume.volume_id, "path": volume.path}]}
    return {"persistent": {"size": volume.size_gb, "path": volume.path}}


def rest_create_body(r: PodRequest) -> dict[str, Any]:
    """The POST /v2/pods body for one placement attempt (unknown fields would be a 422)."""
    if r.interruptible:
        raise UsageError("REST v2 has no spot field: interruptible pods are created through GraphQL")
    body: dict[str, Any] = {
        "name": r.name,
        "image": r.image,
        "args": r.args,
        "disk": r.disk_gb,
        "ports": list(r.ports),
        "env": dict(r.env),
        "cloud": r.cloud,
        "startSsh": r.ssh,
    }
    if r.data_center:
        body["dataCenterIds"] = [r.data_center]
    if r.gpu is not None:
        body["gpu"] = {"id": r.gpu.type, "count": r.gpu.count}
    elif r.cpu is not None:
        body["cpu"] = {"id": r.cpu.id, "vcpuCount": r.cpu.vcpus}
    mounts = mounts_body(r.volume)
    if mounts:
        body["mounts"] = mounts
    return body


def rest_template_body(t: TemplateRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": t.name,
        "image": t.image,
        "args": t.args,
        "disk": t.disk_gb,
        "ports": list(t.ports),
        "env": dict(t.env),
        "startSsh": t.ssh,
        "startJupyter": False,
        "category": t.category,
    }
    if t.volume is not None and not t.volume.network:
        body["mounts"] = mounts_body(t.volume)
    return body

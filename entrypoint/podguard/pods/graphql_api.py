"""`PodApi` through the `runpod` SDK (GraphQL): spot pods, and `--api graphql`. The only module that imports it.

    api = GraphqlApi(key, rest=rest_api, policy=RetryPolicy())
    pod = api.create_pod(request)       # interruptible requests become podRentInterruptable

The SDK (1.12) pastes values into GraphQL text unescaped, so every string is encoded first (`gql_text`):
quotes, backslashes, control characters and non-ASCII become `\\uXXXX` escapes, which the SDK's own
`"`-escaping leaves intact. Its failures are mapped to ApiError: `KeyError` (a 429 or error page without
`data`), JSON decode errors (an HTML 502), `QueryError` by its message, requests' connection errors.
GraphQL has no restart and no logs: those two go through the REST client. When GraphQL is retired, this
module goes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import requests
import runpod
from runpod import error as rp_error
from runpod.api.graphql import run_graphql_query

from podguard.errors import UsageError
from podguard.pods.auth import ApiKey, key_hint
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.pod import (
    ApiKind,
    GpuInfo,
    Pod,
    PodAction,
    PodRequest,
    PodStatus,
    PortInfo,
    TemplateRequest,
    Volume,
)
from podguard.pods.pod import allowed_actions as _allowed
from podguard.pods.rest_api import RestApi, RestLogStream
from podguard.pods.retry import RetryPolicy, with_retry
from podguard.redact import redact_text

__all__ = ["GraphqlApi", "gql_text", "pod_from_graphql"]

T = TypeVar("T")

_KINDS = (
    (r"not enough free gpus|no longer any instances|no (available )?capacity|out of stock", ApiErrorKind.NO_CAPACITY),
    (r"not found|does not exist", ApiErrorKind.NOT_FOUND),
    (r"balance|insufficient funds", ApiErrorKind.NO_BALANCE),
    (r"rate limit|too many requests", ApiErrorKind.RATE_LIMITED),
    (r"unauthori[sz]ed|forbidden|access denied|permission", ApiErrorKind.FORBIDDEN),
    (r"not allowed|invalid state|cannot be (stopped|started|resumed)", ApiErrorKind.CONFLICT),
    (r"internal server error|timed? ?out|temporarily|something went wrong", ApiErrorKind.TRANSIENT),
)


def gql_text(value: str) -> str:
    """The inside of a GraphQL string literal for `value`: printable ASCII only, never a `"` or raw newline."""
    out: list[str] = []
    for ch in value:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0x20 <= code < 0x7F and ch != '"':
            out.append(ch)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


class GraphqlApi:
    kind = ApiKind.GRAPHQL

    def __init__(self, key: ApiKey, *, rest: RestApi, policy: RetryPolicy) -> None:
        self.policy = policy
        self.rest = rest
        self._key = key
        runpod.api_key = key.value  # stop/resume/terminate in the SDK read only the module-level key

    # -- error mapping -------------------------------------------------------------------------------
    def _mapped(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except rp_error.AuthenticationError:
            raise ApiError(
                ApiErrorKind.AUTH, f"RunPod rejected the API key from {self._key.source} (GraphQL); {key_hint()}"
            ) from None
        except rp_error.QueryError as exc:
            text = redact_text(self._key.scrub(str(exc.message or "")))[:500]
            kind = next((k for pattern, k in _KINDS if re.search(pattern, text, re.I)), ApiErrorKind.REJECTED)
            raise ApiError(kind, f"{what}: {text}", detail=text) from None
        except requests.exceptions.JSONDecodeError:
            raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: the answer was not JSON (an error page)") from None
        except requests.exceptions.RequestException as exc:
            raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: {type(exc).__name__}") from None
        except (KeyError, TypeError):
            raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: the answer carried no data (HTTP 429 or 5xx)") from None
        except ValueError as exc:  # the SDK's own input checks, e.g. "No GPU found with the specified ID"
            raise ApiError(ApiErrorKind.REJECTED, f"{what}: {exc}", detail=str(exc)) from None

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return with_retry(lambda: self._mapped(what, fn), self.policy, what=what)

    def _query(self, text: str) -> dict[str, Any]:
        return run_graphql_query(text, api_key=self._key.value)["data"]

    # -- PodApi ----------------------------------------------------------------------------------------
    def list_pods(self) -> list[Pod]:
        raw = self._call("list pods", lambda: runpod.get_pods(api_key=self._key.value))
        return [pod_from_graphql(p) for p in raw or []]

    def get_pod(self, pod_id: str) -> Pod:
        raw = self._call(f"get pod {pod_id}", lambda: runpod.get_pod(gql_text(pod_id), api_key=self._key.value))
        if not raw:
            raise ApiError(ApiErrorKind.NOT_FOUND, f"no pod with id {pod_id!r}")
        return pod_from_graphql(raw)

    def create_pod(self, request: PodRequest) -> Pod:
        if request.gpu is None:
            raise UsageError("CPU pods are created through REST; drop --api graphql for this spec")
        what = f"create pod {request.name}"
        if request.interruptible:
            bid = request.bid_per_gpu or self._minimum_bid(request.gpu)
            created = self._mapped(what, lambda: self._query(spot_mutation(request, bid))["podRentInterruptable"])
        else:
            created = self._mapped(what, lambda: runpod.create_pod(**sdk_create_args(request)))
        if not isinstance(created, dict) or not created.get("id"):
            raise ApiError(ApiErrorKind.TRANSIENT, f"{what}: the answer named no pod")
        return self.get_pod(str(created["id"]))

    def _minimum_bid(self, gpu: GpuInfo) -> float:
        info = self._call(f"price of {gpu.type}", lambda: runpod.get_gpu(gql_text(gpu.type), gpu.count))
        price = (info.get("lowestPrice") or {}).get("minimumBidPrice")
        if not price:
            raise ApiError(ApiErrorKind.NO_CAPACITY, f"no spot price for {gpu.type} (none available)")
        return float(price)

    def act(self, pod_id: str, action: PodAction) -> Pod | None:
        if action is PodAction.RESTART:
            return self.rest.act(pod_id, action)  # GraphQL has no restart
        pid = gql_text(pod_id)
        what = f"{action} pod {pod_id}"
        if action is PodAction.STOP:
            self._call(what, lambda: runpod.stop_pod(pid))
        elif action is PodAction.START:
            pod = self.get_pod(pod_id)
            count = pod.gpu.count if pod.gpu else 0
            self._call(what, lambda: runpod.resume_pod(pid, count))
        else:
            self._call(what, lambda: runpod.terminate_pod(pid))
            return None
        return self.get_pod(pod_id)

    def open_logs(
        self, pod_id: str, *, since: str | None, tail: int | None, last_event_id: str = "", source: str | None = None
    ) -> RestLogStream:
        return self.rest.open_logs(pod_id, since=since, tail=tail, last_event_id=last_event_id, source=source)

    def upsert_template(self, request: TemplateRequest) -> tuple[str, bool]:
        def named() -> dict[str, Any] | None:
            listed = self._query("query { myself { podTemplates { id name } } }")["myself"]["podTemplates"]
            return next((t for t in listed or [] if t.get("name") == request.name), None)

        existing = self._call("list templates", named)
        if existing is not None:
            tid = str(existing["id"])
            self._call(f"update template {tid}", lambda: self._query(template_mutation(request, tid)))
            return tid, False
        args = sdk_template_args(request)
        created = with_retry(
            lambda: self._mapped("create template", lambda: runpod.create_template(**args)),
            self.policy,
            what="create template",
            before_retry=lambda _e: self._call("list templates", named),
        )
        return str(created["id"]), True


# -- encoding requests -----------------------------------------------------------------------------------
def _env_list(env: dict[str, str]) -> str:
    return "[" + ", ".join(f'{{ key: "{gql_text(k)}", value: "{gql_text(v)}" }}' for k, v in env.items()) + "]"


def sdk_create_args(r: PodRequest) -> dict[str, Any]:
    """Keyword arguments for runpod.create_pod, every string already encoded for GraphQL text."""
    assert r.gpu is not None
    volume = r.volume
    return {
        "name": gql_text(r.name),
        "image_name": gql_text(r.image),
        "gpu_type_id": gql_text(r.gpu.type),
        "cloud_type": r.cloud,
        "start_ssh": r.ssh,
        "data_center_id": gql_text(r.data_center) if r.data_center else None,
        "gpu_count": r.gpu.count,
        "volume_in_gb": (volume.size_gb or 0) if volume is not None else 0,
        "container_disk_in_gb": r.disk_gb,
        "docker_args": gql_text(r.args),
        "ports": gql_text(",".join(r.ports)) or None,
        "volume_mount_path": gql_text(volume.path) if volume is not None else "/workspace",
        "env": {gql_text(k): gql_text(v) for k, v in r.env.items()},
        "network_volume_id": gql_text(volume.volume_id) if volume is not None and volume.volume_id else None,
    }


def spot_mutation(r: PodRequest, bid: float) -> str:
    """podRentInterruptable (the SDK has no spot call): the same fields as on-demand plus bidPerGpu."""
    assert r.gpu is not None
    volume = r.volume
    fields = [
        f'name: "{gql_text(r.name)}"',
        f'imageName: "{gql_text(r.image)}"',
        f'gpuTypeId: "{gql_text(r.gpu.type)}"',
        f"gpuCount: {int(r.gpu.count)}",
        f"bidPerGpu: {float(bid):.4f}",
        f"cloudType: {r.cloud}",
        f"containerDiskInGb: {int(r.disk_gb)}",
        f"volumeInGb: {int(volume.size_gb or 0) if volume is not None else 0}",
        f'volumeMountPath: "{gql_text(volume.path if volume is not None else "/workspace")}"',
        f'dockerArgs: "{gql_text(r.args)}"',
        f'ports: "{gql_text(",".join(r.ports))}"',
        f"startSsh: {'true' if r.ssh else 'false'}",
        "supportPublicIp: true",
        f"env: {_env_list(r.env)}",
    ]
    if r.data_center:
        fields.append(f'dataCenterId: "{gql_text(r.data_center)}"')
    if volume is not None and volume.volume_id:
        fields.append(f'networkVolumeId: "{gql_text(volume.volume_id)}"')
    return (
        f"mutation {{ podRentInterruptable(input: {{ {', '.join(fields)} }}) "
        "{ id desiredStatus imageName machineId } }"
    )


def sdk_template_args(t: TemplateRequest) -> dict[str, Any]:
    return {
        "name": gql_text(t.name),
        "image_name": gql_text(t.image),
        "docker_start_cmd": gql_text(t.args),
        "container_disk_in_gb": t.disk_gb,
        "volume_in_gb": t.volume.size_gb if t.volume is not None else None,
        "volume_mount_path": gql_text(t.volume.path) if t.volume is not None else None,
        "ports": gql_text(",".join(t.ports)),
        "env": {gql_text(k): gql_text(v) for k, v in t.env.items()},
    }


def template_mutation(t: TemplateRequest, template_id: str) -> str:
    """saveTemplate with an id updates (the SDK's create_template cannot)."""
    fields = [
        f'id: "{gql_text(template_id)}"',
        f'name: "{gql_text(t.name)}"',
        f'imageName: "{gql_text(t.image)}"',
        f'dockerArgs: "{gql_text(t.args)}"',
        f"containerDiskInGb: {int(t.disk_gb)}",
        f"volumeInGb: {int(t.volume.size_gb or 0) if t.volume is not None else 0}",
        f'ports: "{gql_text(",".join(t.ports))}"',
        f"env: {_env_list(t.env)}",
        "isServerless: false",
    ]
    return f"mutation {{ saveTemplate(input: {{ {', '.join(fields)} }}) {{ id name }} }}"


# -- decoding answers ------------------------------------------------------------------------------------
def _status(d: dict[str, Any]) -> PodStatus:
    desired = str(d.get("desiredStatus") or "").upper()
    if desired == "RUNNING":
        if d.get("runtime"):
            return PodStatus.RUNNING
        return PodStatus.STARTING if d.get("machineId") else PodStatus.PROVISIONING
    return {
        "CREATED": PodStatus.PROVISIONING,
        "RESTARTING": PodStatus.STARTING,
        "EXITED": PodStatus.EXITED,
        "PAUSED": PodStatus.EXITED,
        "DEAD": PodStatus.ERROR,
        "TERMINATED": PodStatus.TERMINATED,
    }.get(desired, PodStatus.UNKNOWN)


def _env(raw: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw or []:
        if isinstance(item, dict):
            env[str(item.get("key"))] = str(item.get("value", ""))
        else:
            key, _, value = str(item).partition("=")
            env[key] = value
    return env


def pod_from_graphql(d: dict[str, Any]) -> Pod:
    """A pod from the SDK's QUERY_POD shape (GraphQL knows no start time: `started_at` is None)."""
    status = _status(d)
    runtime = d.get("runtime") or {}
    ports = tuple(
        PortInfo(int(p["privatePort"]), p.get("publicPort"), str(p.get("type", "")), p.get("ip"))
        for p in runtime.get("ports") or []
    )
    ssh = next((f"ssh root@{p.ip} -p {p.public}" for p in ports if p.private == 22 and p.public and p.ip), None)
    count = int(d.get("gpuCount") or 0)
    gpu_name = ((d.get("machine") or {}).get("gpuDisplayName")) or ""
    volume_gb = int(d.get("volumeInGb") or 0)
    return Pod(
        id=str(d["id"]),
        name=str(d.get("name", "")),
        status=status,
        gpu=GpuInfo(gpu_name, count) if count else None,
        cost_per_hr=None if d.get("costPerHr") is None else float(d["costPerHr"]),
        ssh=ssh,
        ports=ports,
        actions=_allowed(status),
        image=str(d.get("imageName", "")),
        args=str(d.get("dockerArgs") or ""),
        env=_env(d.get("env")),
        port_specs=tuple(p for p in str(d.get("ports") or "").split(",") if p),
        disk_gb=d.get("containerDiskInGb"),
        volume=Volume(path=str(d.get("volumeMountPath") or "/workspace"), size_gb=volume_gb) if volume_gb else None,
        interruptible=str(d.get("podType", "")).upper() == "INTERRUPTABLE",
        has_runtime=bool(d.get("runtime")) if "runtime" in d else None,  # null runtime: no container runs
    )

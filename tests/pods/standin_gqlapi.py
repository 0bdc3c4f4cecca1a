"""The stand-in's GraphQL endpoint: the queries and mutations the `runpod` SDK (and podguard's spot and
template mutations) send, answered from the same world as REST. Syntax errors and refusals come back the
way GraphQL servers answer them: HTTP 200 with `{"errors": [{"message": ...}]}`."""

from __future__ import annotations

import json
from typing import Any

from standin_gql import Field, GqlSyntaxError, parse_operation
from standin_state import GPU_TYPES, Refusal, World
from standin_views import gql_pod_view


def handle_graphql(world: World, raw: bytes) -> tuple[int, Any]:
    try:
        op = parse_operation(json.loads(raw)["query"])
    except (GqlSyntaxError, ValueError, KeyError) as exc:
        return 200, {"errors": [{"message": f"Syntax Error: {exc}"}]}
    data: dict[str, Any] = {}
    try:
        with world.lock:
            for f in op.fields:
                data[f.name] = _resolve(world, op.kind, f)
    except Refusal as exc:
        if exc.status == 402:
            raise
        return 200, {"errors": [{"message": exc.detail}], "data": None}
    return 200, {"data": data}


def _resolve(world: World, kind: str, f: Field) -> Any:
    inp = f.args.get("input") or {}
    if kind == "query":
        if f.name == "myself":
            return {
                "id": "user-1",
                "pubKey": "",
                "pods": [gql_pod_view(p) for p in world.pods.values() if p.status != "TERMINATED"],
                "networkVolumes": [{"id": "vol-1", "name": "data", "size": 100, "dataCenterId": "EU-RO-1"}],
                "podTemplates": [{"id": tid, "name": t["name"]} for tid, t in world.templates.items()],
            }
        if f.name == "pod":
            pod = world.pods.get(inp.get("podId"))
            return None if pod is None or pod.status == "TERMINATED" else gql_pod_view(pod)
        if f.name == "gpuTypes":
            return [_gpu_type(t, inp) for t in GPU_TYPES if "id" not in inp or inp["id"] == t]
    elif f.name in ("podFindAndDeployOnDemand", "podRentInterruptable"):
        return _deploy(world, inp, interruptible=f.name == "podRentInterruptable")
    elif f.name in ("podStop", "podResume", "podTerminate"):
        action = {"podStop": "stop", "podResume": "start", "podTerminate": "terminate"}[f.name]
        try:
            pod = world.act(str(inp.get("podId")), action)
        except Refusal as exc:
            if exc.status == 409:
                raise Refusal(400, f"pod cannot be {action}ed: not allowed in its current status") from None
            raise
        return None if pod is None else {**gql_pod_view(pod), "desiredStatus": gql_pod_view(pod)["desiredStatus"]}
    elif f.name == "saveTemplate":
        return _save_template(world, inp)
    raise Refusal(400, f'Cannot query field "{f.name}" on type "{kind.capitalize()}"')


def _gpu_type(gpu_id: str, inp: dict[str, Any]) -> dict[str, Any]:
    price, spot = GPU_TYPES[gpu_id]
    return {
        "id": gpu_id,
        "displayName": gpu_id.replace("NVIDIA ", ""),
        "memoryInGb": 80,
        "maxGpuCount": 8,
        "securePrice": price,
        "communityPrice": price * 0.8,
        "secureSpotPrice": spot,
        "communitySpotPrice": spot * 0.8,
        "lowestPrice": {"minimumBidPrice": spot, "uninterruptablePrice": price},
    }


def _deploy(world: World, inp: dict[str, Any], *, interruptible: bool) -> dict[str, Any]:
    """Map the GraphQL input to the REST body the world understands (so both APIs share placement)."""
    body: dict[str, Any] = {
        "name": inp["name"],
        "image": inp["imageName"],
        "args": inp.get("dockerArgs", ""),
        "disk": inp.get("containerDiskInGb", 50),
        "ports": [p for p in str(inp.get("ports") or "").split(",") if p],
        "env": {e["key"]: e["value"] for e in inp.get("env") or []},
        "cloud": str(inp.get("cloudType", "SECURE")),
        "gpu": {"id": inp["gpuTypeId"], "count": inp.get("gpuCount", 1)},
    }
    if inp.get("dataCenterId"):
        body["dataCenterIds"] = [inp["dataCenterId"]]
    if inp.get("networkVolumeId"):
        body["mounts"] = {"network": [{"volumeId": inp["networkVolumeId"], "path": inp.get("volumeMountPath")}]}
    elif inp.get("volumeInGb"):
        body["mounts"] = {"persistent": {"size": inp["volumeInGb"], "path": inp.get("volumeMountPath")}}
    bid = inp.get("bidPerGpu")
    if interruptible:
        minimum = GPU_TYPES.get(inp["gpuTypeId"], (0, 0))[1]
        if bid is None or float(bid) < minimum:
            raise Refusal(400, f"Your bid is lower than the minimum bid price of ${minimum}/hr")
    pod = world.create(body, interruptible=interruptible, bid=bid)
    return {
        "id": pod.id,
        "imageName": pod.image,
        "env": [],
        "machineId": pod.machine.id,
        "desiredStatus": "RUNNING",
        "machine": {"podHostId": f"{pod.id}-host"},
    }


def _save_template(world: World, inp: dict[str, Any]) -> dict[str, Any]:
    tid = str(inp.get("id") or f"tpl{len(world.templates) + 1}")
    world.templates[tid] = {
        "id": tid,
        "name": inp["name"],
        "image": inp["imageName"],
        "args": inp.get("dockerArgs", ""),
        "disk": inp.get("containerDiskInGb", 10),
        "ports": [p for p in str(inp.get("ports") or "").split(",") if p],
        "env": {e["key"]: e["value"] for e in inp.get("env") or []},
    }
    return {"id": tid, "name": inp["name"]}

"""How the stand-in shows a pod or template: the REST v2 shape (OpenAPI `Pod`) and the SDK's GraphQL shape."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from standin_state import ClusterRecord, PodRecord, World


def _runtime_ports(pod: PodRecord) -> list[dict[str, Any]]:
    out = []
    for i, spec in enumerate(pod.ports):
        port, _, kind = spec.partition("/")
        public = 40000 + int(pod.id[3:7]) * 10 + i if kind == "tcp" else None
        out.append({"private": int(port), "public": public, "type": kind, "ip": "203.0.113.7" if public else None})
    return out


def _uptime(pod: PodRecord) -> int:
    """Whole seconds since the pod's start (the stand-in's startedAt, which tests may move back), or since its
    container started again by itself (a crash loop, a restart of the container)."""
    if not pod.started_at:
        return 0
    started = datetime.fromisoformat(pod.started_at.replace("Z", "+00:00")).timestamp()
    if pod.restarts:
        started = max(started, pod.container_started)
    return max(0, int(time.time() - started))


def pod_view(pod: PodRecord) -> dict[str, Any]:
    running = pod.status == "RUNNING"
    ports = _runtime_ports(pod) if running else []
    direct = next((p for p in ports if p["private"] == 22 and p["public"]), None)
    view: dict[str, Any] = {
        "id": pod.id,
        "name": pod.name,
        "status": pod.status,
        "actions": pod.actions,
        "image": pod.image,
        "args": pod.args,
        "disk": pod.disk,
        "mounts": pod.mounts,
        "ports": pod.ports,
        "env": pod.env,
        "registry": None,
        "cloud": pod.cloud,
        "dataCenterId": pod.machine.dc,
        "cudaVersion": "12.8" if pod.gpu_type else None,
        "ssh": {
            "proxy": {
                "host": "ssh.runpod.io",
                "port": 22,
                "username": f"{pod.id}-64411eb2",
                "command": f"ssh {pod.id}-64411eb2@ssh.runpod.io",
            },
            "direct": None
            if direct is None
            else {
                "host": direct["ip"],
                "port": direct["public"],
                "username": "root",
                "command": f"ssh root@{direct['ip']} -p {direct['public']}",
            },
        },
        "template": None,
        "cost": pod.cost,
        "locked": False,
        "globalNetworking": {"enabled": False},
        "runtime": {"uptime": _uptime(pod), "ports": ports} if running and not pod.host_lost else None,
        "createdAt": pod.created_at,
        "startedAt": pod.started_at,
    }
    if pod.cluster_id is not None:
        view["cluster"] = {"id": pod.cluster_id, "rank": pod.rank, "ip": pod.cluster_ip}
    if pod.odd is not None and time.monotonic() < pod.odd[1]:
        if pod.odd[0] is None:
            del view["status"]  # an answer without a status
        else:
            view["status"] = pod.odd[0]
    view["interruptible"] = pod.interruptible  # a field the client does not know: it must be ignored
    if pod.gpu_type:  # the newer revision's per-GPU-set details beside id and count
        view["gpu"] = {"id": pod.gpu_type, "count": pod.gpu_count, "vcpuCount": 8 * pod.gpu_count, "memory": 62}
    else:
        view["cpu"] = {**(pod.cpu or {}), "memory": 8}
    return view


def cluster_view(world: World, cluster: ClusterRecord) -> dict[str, Any]:
    """The REST v2 `Cluster`: identity, shape and only aggregate member counts (`pods {total, byStatus}`)."""
    members = world.members(cluster)
    by_status: dict[str, int] = {}
    for pod in members:
        by_status[pod.status] = by_status.get(pod.status, 0) + 1
    primary = next((p for p in members if p.rank == 0), None)
    view: dict[str, Any] = {
        "id": cluster.id,
        "name": cluster.name,
        "type": cluster.type,
        "compute": cluster.compute,
        "dataCenterId": cluster.dc,
        "pods": {"total": len(members), "byStatus": by_status},
        "network": {"cidr": "10.65.0.0/16", "vxlanId": 42, "vxlanPort": 4789},
        "createdAt": cluster.created_at,
    }
    if primary is not None:
        view["primary"] = {"podId": primary.id, "status": primary.status}
        ssh = next((p for p in _runtime_ports(primary) if p["private"] == 22 and p["public"]), None)
        if primary.status == "RUNNING" and ssh is not None:
            view["primary"]["sshEndpoint"] = f"{ssh['ip']}:{ssh['public']}"
    return view


def template_view(t: dict[str, Any]) -> dict[str, Any]:
    return {
        "ports": [],
        "env": {},
        "mounts": {},
        "registry": None,
        "serverless": False,
        "public": False,
        "category": "NVIDIA",
        "startSsh": True,
        "startJupyter": False,
        "allowedCudaVersions": [],
        **t,
    }


def gql_pod_view(pod: PodRecord) -> dict[str, Any]:
    running = pod.status == "RUNNING"
    desired = {"EXITED": "EXITED", "TERMINATED": "TERMINATED", "ERROR": "DEAD"}.get(pod.status, "RUNNING")
    ports = [
        {
            "ip": p["ip"],
            "isIpPublic": bool(p["ip"]),
            "privatePort": p["private"],
            "publicPort": p["public"],
            "type": p["type"],
        }
        for p in _runtime_ports(pod)
    ]
    persistent = pod.mounts.get("persistent") or {}
    network = (pod.mounts.get("network") or [{}])[0]
    return {
        "id": pod.id,
        "name": pod.name,
        "containerDiskInGb": pod.disk,
        "costPerHr": pod.cost,
        "desiredStatus": desired,
        "dockerArgs": pod.args,
        "dockerId": None,
        "env": [f"{k}={v}" for k, v in pod.env.items()],
        "gpuCount": pod.gpu_count,
        "imageName": pod.image,
        "lastStatusChange": f"Rented by User: {pod.created_at}",
        "machineId": pod.machine.id if pod.status != "PROVISIONING" else "",
        "memoryInGb": 62,
        "podType": "INTERRUPTABLE" if pod.interruptible else "RESERVED",
        "port": 22,
        "ports": ",".join(pod.ports),
        "uptimeSeconds": _uptime(pod) if running else 0,
        "vcpuCount": 8,
        "volumeInGb": persistent.get("size", 0),
        "volumeMountPath": persistent.get("path") or network.get("path") or "/workspace",
        "runtime": {"ports": ports} if running else None,
        "machine": {"gpuDisplayName": pod.gpu_type or "", "podHostId": f"{pod.id}-host"},
    }

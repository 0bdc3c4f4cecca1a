"""The stand-in RunPod's world: machines with GPUs, pods that provision and start, and their logs.

    world = World(timing=Timing(provision_s=0.05))
    world.set_capacity("NVIDIA A40", 8, dc="EU-RO-1")
    pod = world.create(spec_dict)          # Placement: raises Refusal(400, "...no longer any instances...")

Time moves on its own (a ticker thread): PROVISIONING -> STARTING -> RUNNING, and each container start
writes the lines of a preflight run to the pod's log after `verdict_delay_s`. What the preflight says
depends on the machine's health: "ok" passes; "sick" fails until the pod is stopped and started again
(fresh driver state); "broken" always fails (only a replacement helps); on an "error" machine every boot ends in
ERROR. Tests may script lines instead. What goes wrong from outside: `lose_host` (RUNNING with no runtime and
no more lines, its start refused), `set_error`, `vanish`, `host_full_on_start` (a start refused for GPUs),
`gpus_on_start` (a start that gives the pod fewer GPUs, none at all after a resume), `odd_status` (a status the
spec does not list, or none, for a while), `crash_loop` (the container restarts every moment, printing an exec
error and never the preflight), `restart_container` (the container starts again: a new preflight, the same
`startedAt`) and `ignore_stops` (a stop answered 200 and not carried out).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

DATA_CENTERS = ("EU-RO-1", "US-KS-2", "US-TX-3")
GPU_TYPES = {
    "NVIDIA H100 80GB HBM3": (2.99, 1.75),
    "NVIDIA A100 80GB PCIe": (1.64, 0.82),
    "NVIDIA A40": (0.44, 0.20),
    "NVIDIA RTX A6000": (0.49, 0.25),
}
NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)
HOST_FULL = "There are not enough free GPUs on the host machine to start this pod."


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Refusal(Exception):
    """An answer the API gives instead of doing it (status + detail; GraphQL turns it into `errors`)."""

    def __init__(self, status: int, detail: str, errors: list[str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []


@dataclass
class Timing:
    provision_s: float = 0.05
    start_s: float = 0.05
    verdict_delay_s: float = 0.05
    keepalive_s: float = 0.5


@dataclass
class Machine:
    id: str
    dc: str
    gpu_type: str | None
    free: int
    health: str = "ok"  # ok | sick | broken | error (every boot ends in ERROR)


@dataclass
class LogLine:
    seq: int
    ts: str
    source: str
    line: str

    @property
    def event_id(self) -> str:
        return f"{self.ts}/{self.seq:012d}"


@dataclass
class PodRecord:
    id: str
    name: str
    image: str
    args: str
    env: dict[str, str]
    ports: list[str]
    disk: int
    cloud: str
    gpu_type: str | None
    gpu_count: int
    cpu: dict[str, Any] | None
    mounts: dict[str, Any]
    machine: Machine
    interruptible: bool = False
    bid: float | None = None
    status: str = "PROVISIONING"
    until: float = 0.0
    started_at: str | None = None
    created_at: str = field(default_factory=now_iso)
    starts: int = 0
    last_start: str = "create"  # create | restart | start
    logs: list[LogLine] = field(default_factory=list)
    pending: list[tuple[float, str, str]] = field(default_factory=list)  # (due, source, line)
    cluster_id: str | None = None  # a member of an Instant Cluster: rank and private address
    rank: int | None = None
    cluster_ip: str | None = None
    host_lost: bool = False  # the host is gone: RUNNING on paper, no runtime, no more lines, no start
    container_started: float = 0.0  # time.time() of the container's latest start (runtime.uptime counts from it)
    odd: tuple[str | None, float] | None = None  # (status shown instead, until monotonic): RESTARTING, or None: none
    crash: tuple[str, float] | None = None  # (the line each crash prints, seconds between restarts)
    next_crash: float = 0.0
    restarts: int = 0  # container restarts (crash loop or restart_container)

    @property
    def actions(self) -> list[str]:
        return {
            "RUNNING": ["stop", "restart", "terminate"],
            "EXITED": ["start", "terminate"],
            "ERROR": ["start", "terminate"],
            "PROVISIONING": ["stop", "terminate"],
            "STARTING": ["stop", "terminate"],
        }.get(self.status, [])

    @property
    def cost(self) -> float:
        if self.status in ("EXITED", "TERMINATED") or self.gpu_type is None:
            return 0.0 if self.status in ("EXITED", "TERMINATED") else 0.12
        price = GPU_TYPES[self.gpu_type][1 if self.interruptible else 0]
        return round(price * self.gpu_count, 2)


def verdict_lines(pod: PodRecord) -> list[str]:
    """What podguard's preflight prints in this pod on this start, by its machine's health."""
    n = pod.gpu_count
    if pod.gpu_type and n == 0:  # RunPod started it without GPUs: the preflight finds none and ends 69
        return [
            "podguard train: FAIL on 0 GPU(s) in 12 ms",
            "  no GPU is visible in this container: RunPod started the pod without GPUs",
            "podguard train: END preflight exit 69 after 1 attempt(s)",
        ]
    if pod.machine.health == "ok":
        return [
            "podguard: cleanup: no process holds the selected GPUs",
            f"podguard train: PASS on {n} GPU(s) in 842 ms",
        ]
    return [
        f"podguard train: UNHEALTHY on {n} GPU(s) in 1311 ms",
        "  GPU3 UNHEALTHY: XID 79 (GPU has fallen off the bus)",
        "  -> the GPU needs a reset: restart the pod, or run it on another machine",
    ]


def same_as(pod: PodRecord) -> dict[str, Any]:
    """A create body for a pod like `pod` in its data centre (a second actor's: `pod heal --replace` elsewhere, which
    copies the pod's env: podguard's mark included)."""
    gpu = {"id": pod.gpu_type, "count": pod.gpu_count} if pod.gpu_type else None
    body = {"name": pod.name, "image": pod.image, "args": pod.args, "gpu": gpu, "mounts": pod.mounts}
    return {**body, "env": dict(pod.env), "dataCenterIds": [pod.machine.dc]}


@dataclass
class ClusterRecord:
    id: str
    name: str
    type: str
    compute: dict[str, Any]
    dc: str
    members: list[str]
    created_at: str = field(default_factory=now_iso)


class World:
    def __init__(self, timing: Timing | None = None) -> None:
        self.timing = timing or Timing()
        self.lock = threading.Condition()
        self.pods: dict[str, PodRecord] = {}
        self.templates: dict[str, dict[str, Any]] = {}
        self.clusters: dict[str, ClusterRecord] = {}
        self.member_actions = False  # True: members take pod actions; False: 409 (manage them through the cluster)
        self.max_body = 100 * 1024  # a create body over this is a 413
        self.capacity: dict[tuple[str, str], int] = {}
        self.new_machine_health: list[str] = []  # health of the next machines created, in order
        self.ignore_restart = False  # "restart returns 200 and does nothing"
        self.host_full_on_start = False
        self.ignore_stops = 0  # this many stops are answered 200 and not carried out
        self._template_ids = itertools.count(1)
        self.gpus_on_start: int | None = None  # a start gives the pod this many GPUs (a resume can give it none)
        self.balance_ok = True
        self.script: Callable[[PodRecord], list[str]] | None = None
        self.before_action: Callable[[PodRecord], None] | None = None  # e.g. the status changes under a client
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="standin-ticker", daemon=True)

    # -- setup ---------------------------------------------------------------------------------------------
    def set_capacity(self, gpu_type: str, free: int, dc: str | None = None) -> None:
        with self.lock:
            for d in [dc] if dc else DATA_CENTERS:
                self.capacity[(gpu_type, d)] = free

    def start(self) -> None:
        self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        with self.lock:
            self.lock.notify_all()

    # -- placement -----------------------------------------------------------------------------------------
    def _machine(self, gpu_type: str | None, count: int, dcs: list[str]) -> Machine:
        for dc in dcs or list(DATA_CENTERS):
            if gpu_type is None:
                return Machine(f"m{next(self._ids)}", dc, None, 0, self._next_health())
            free = self.capacity.get((gpu_type, dc), 0)
            if free >= count:
                self.capacity[(gpu_type, dc)] = free - count
                return Machine(f"m{next(self._ids)}", dc, gpu_type, 0, self._next_health())
        where = ", ".join(dcs) if dcs else "any data center"
        raise Refusal(400, f"could not place {count}x {gpu_type} in {where}: {NO_CAPACITY}")

    def _next_health(self) -> str:
        return self.new_machine_health.pop(0) if self.new_machine_health else "ok"

    def create(self, body: dict[str, Any], *, interruptible: bool = False, bid: float | None = None) -> PodRecord:
        """Place and create a pod from a normalised body (REST field names); Refusal when it cannot."""
        with self.lock:
            if not self.balance_ok:
                raise Refusal(402, "insufficient balance")
            gpu = body.get("gpu")
            if gpu is not None and gpu["id"] not in GPU_TYPES:
                raise Refusal(400, f"unknown GPU type {gpu['id']!r}")
            count = int(gpu.get("count", 1)) if gpu else 0
            machine = self._machine(gpu["id"] if gpu else None, count, list(body.get("dataCenterIds") or []))
            pod = PodRecord(
                id=f"pod{next(self._ids):04d}x",
                name=body["name"],
                image=body["image"],
                args=body.get("args", ""),
                env=dict(body.get("env") or {}),
                ports=list(body.get("ports") or []),
                disk=int(body.get("disk", 50)),
                cloud=body.get("cloud", "SECURE"),
                gpu_type=gpu["id"] if gpu else None,
                gpu_count=count,
                cpu=body.get("cpu"),
                mounts=dict(body.get("mounts") or {}),
                machine=machine,
                interruptible=interruptible,
                bid=bid,
                until=time.monotonic() + self.timing.provision_s,
            )
            self.pods[pod.id] = pod
            self.lock.notify_all()
            return pod

    def create_cluster(self, body: dict[str, Any]) -> ClusterRecord:
        """Place every node in one data centre (the first listed that has room for all), or Refusal 400."""
        with self.lock:
            if not self.balance_ok:
                raise Refusal(402, "insufficient balance")
            compute = body["compute"]
            gpu_type, per_pod, count = compute["gpuTypeId"], int(compute["gpuCountPerPod"]), int(compute["podCount"])
            if gpu_type not in GPU_TYPES:
                raise Refusal(400, f"unknown GPU type {gpu_type!r}")
            dcs = list(body.get("dataCenterIds") or []) or list(DATA_CENTERS)
            dc = next((d for d in dcs if self.capacity.get((gpu_type, d), 0) >= per_pod * count), None)
            if dc is None:
                where = ", ".join(dcs)
                raise Refusal(400, f"could not place {count} nodes x {per_pod}x {gpu_type} in {where}: {NO_CAPACITY}")
            cluster = ClusterRecord(
                id=f"cluster{next(self._ids):04d}",
                name=body["name"],
                type=body.get("type", "TRAINING"),
                compute=dict(compute),
                dc=dc,
                members=[],
            )
            for rank in range(count):
                pod_body = {**body, "gpu": {"id": gpu_type, "count": per_pod}, "dataCenterIds": [dc]}
                pod = self.create(pod_body)
                pod.cluster_id, pod.rank, pod.cluster_ip = cluster.id, rank, f"10.65.0.{rank + 2}"
                cluster.members.append(pod.id)
            self.clusters[cluster.id] = cluster
            return cluster

    def get_cluster(self, cluster_id: str) -> ClusterRecord:
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            raise Refusal(404, f"cluster {cluster_id} not found")
        return cluster

    def delete_cluster(self, cluster_id: str) -> None:
        with self.lock:
            cluster = self.get_cluster(cluster_id)
            for pod_id in cluster.members:
                pod = self.pods[pod_id]
                if pod.status != "TERMINATED":
                    pod.status = "TERMINATED"
                    self._release(pod)
            del self.clusters[cluster_id]
            self.lock.notify_all()

    def members(self, cluster: ClusterRecord) -> list[PodRecord]:
        return [self.pods[p] for p in cluster.members if self.pods[p].status != "TERMINATED"]

    # -- actions -------------------------------------------------------------------------------------------
    def get(self, pod_id: str) -> PodRecord:
        pod = self.pods.get(pod_id)
        if pod is None or pod.status == "TERMINATED":
            raise Refusal(404, f"pod {pod_id} not found")
        return pod

    def act(self, pod_id: str, action: str) -> PodRecord | None:
        with self.lock:
            pod = self.get(pod_id)
            if self.before_action is not None:
                self.before_action(pod)
                self.before_action = None
            if pod.cluster_id is not None and not self.member_actions:
                raise Refusal(409, f"pod {pod_id} is a member of cluster {pod.cluster_id}; use the cluster")
            if action not in pod.actions:
                raise Refusal(409, f"action {action!r} is not allowed in status {pod.status}")
            if action == "terminate":
                pod.status = "TERMINATED"
                self._release(pod)
            elif action == "stop" and self.ignore_stops > 0:
                self.ignore_stops -= 1  # "stop returns 200 and does nothing"
            elif action == "stop":
                pod.status, pod.pending, pod.crash = "EXITED", [], None
                if not pod.host_lost:
                    pod.machine.free += pod.gpu_count
            elif action == "start":
                if self.host_full_on_start or pod.host_lost or pod.machine.free < pod.gpu_count:
                    raise Refusal(400, HOST_FULL)
                if self.gpus_on_start is not None:
                    pod.gpu_count = self.gpus_on_start
                pod.machine.free -= pod.gpu_count
                if pod.machine.health == "sick":
                    pod.machine.health = "ok"  # a fresh start resets the driver state
                pod.status, pod.until, pod.last_start = "STARTING", time.monotonic() + self.timing.start_s, "start"
            elif action == "restart" and not self.ignore_restart:
                pod.status, pod.until, pod.last_start = "STARTING", time.monotonic() + self.timing.start_s, "restart"
                pod.pending = []
            self.lock.notify_all()
            return None if action == "terminate" else pod

    def new_template_id(self) -> str:
        return f"tpl{next(self._template_ids)}"

    def _release(self, pod: PodRecord) -> None:
        if pod.gpu_type is not None:
            key = (pod.gpu_type, pod.machine.dc)
            self.capacity[key] = self.capacity.get(key, 0) + pod.gpu_count

    def backdate(self, pod_id: str, seconds: float) -> None:
        """Move the pod's start `seconds` into the past: its clock has run that much longer (spend, uptime)."""
        with self.lock:
            pod = self.get(pod_id)
            assert pod.started_at is not None, "the pod has not started yet"
            started = datetime.fromisoformat(pod.started_at.replace("Z", "+00:00")).timestamp() - seconds
            pod.started_at = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # -- what goes wrong from outside ---------------------------------------------------------------------
    def lose_host(self, pod_id: str) -> None:
        """The host dies under a RUNNING pod: RunPod still says RUNNING, with no runtime; no line comes any more;
        a start is refused (its GPUs are not there)."""
        with self.lock:
            pod = self.get(pod_id)
            pod.host_lost, pod.pending = True, []
            self.lock.notify_all()

    def set_error(self, pod_id: str) -> None:
        """The pod goes to ERROR (its container cannot run there)."""
        with self.lock:
            pod = self.get(pod_id)
            pod.status, pod.pending = "ERROR", []
            self.lock.notify_all()

    def odd_status(self, pod_id: str, shown: str | None, seconds: float) -> None:
        """For `seconds`, the API shows `shown` as the pod's status (one the spec does not list, e.g. RESTARTING),
        or no status at all (None)."""
        with self.lock:
            self.get(pod_id).odd = (shown, time.monotonic() + seconds)

    def crash_loop(
        self, pod_id: str, line: str = "exec /usr/local/bin/podguard: exec format error", every_s: float = 0.2
    ) -> None:
        """The container crash-loops: every `every_s` it prints `line` and starts again; the preflight never comes."""
        with self.lock:
            pod = self.get(pod_id)
            pod.crash, pod.next_crash, pod.pending = (line, every_s), time.monotonic(), []
            self.lock.notify_all()

    def restart_container(self, pod_id: str) -> None:
        """The container starts again by itself (RunPod restarts a container that exited): its preflight runs again,
        `startedAt` stays."""
        with self.lock:
            pod = self.get(pod_id)
            pod.restarts += 1
            pod.container_started = time.time()
            lines = self.script(pod) if self.script is not None else verdict_lines(pod)
            due = time.monotonic() + self.timing.verdict_delay_s
            pod.pending = [(due, "container", line) for line in lines]
            self.lock.notify_all()

    def vanish(self, pod_id: str) -> None:
        """The pod is gone from the API (404), as if terminated behind the user's back."""
        with self.lock:
            pod = self.get(pod_id)
            pod.status = "TERMINATED"
            self._release(pod)
            self.lock.notify_all()

    # -- logs ----------------------------------------------------------------------------------------------
    def emit(self, pod_id: str, line: str, source: str = "container") -> LogLine:
        with self.lock:
            entry = LogLine(next(self._seq), now_iso(), source, line)
            self.pods[pod_id].logs.append(entry)
            self.lock.notify_all()
            return entry

    def _tick_loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                now = time.monotonic()
                for pod in self.pods.values():
                    self._advance(pod, now)
                self.lock.wait(0.005)

    def _advance(self, pod: PodRecord, now: float) -> None:
        if pod.status == "PROVISIONING" and now >= pod.until:
            pod.status, pod.until = "STARTING", now + self.timing.start_s
            self._append(pod, "system", f"pulling image {pod.image}")
        elif pod.status == "STARTING" and now >= pod.until and pod.machine.health == "error":
            pod.status, pod.pending = "ERROR", []
            self._append(pod, "system", "container start failed: the host reported an error")
        elif pod.status == "STARTING" and now >= pod.until:
            pod.status, pod.started_at, pod.starts = "RUNNING", now_iso(), pod.starts + 1
            pod.container_started = time.time()
            lines = self.script(pod) if self.script is not None else verdict_lines(pod)
            due = now + self.timing.verdict_delay_s
            pod.pending = [(due, "container", line) for line in lines]
        if pod.status == "RUNNING" and not pod.host_lost and pod.crash is not None and now >= pod.next_crash:
            line, every = pod.crash
            pod.pending, pod.next_crash, pod.restarts = [], now + every, pod.restarts + 1
            pod.container_started = time.time()
            self._append(pod, "container", line)
        if pod.status == "RUNNING" and not pod.host_lost:
            while pod.pending and pod.pending[0][0] <= now:
                _, source, line = pod.pending.pop(0)
                self._append(pod, source, line)

    def _append(self, pod: PodRecord, source: str, line: str) -> None:
        pod.logs.append(LogLine(next(self._seq), now_iso(), source, line))
        self.lock.notify_all()

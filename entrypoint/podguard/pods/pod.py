"""The records the pod code works with, whichever API produced them.

    pod.status is PodStatus.RUNNING; public_view(pod) -> the `--json` object of docs/formats.md
    PodRequest(name=..., image=..., gpu=GpuInfo("NVIDIA A100 80GB PCIe", 1), ...)   # one create attempt

`Pod` is what a list/get answered; `PodRequest` is one placement attempt (one GPU type, at most one data
centre); `TemplateRequest` is a template to create or update.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from podguard.pods.spend import cost_of, seconds_since

__all__ = [
    "ApiKind",
    "CpuInfo",
    "GpuInfo",
    "LogEvent",
    "Pod",
    "PodAction",
    "PodRequest",
    "PodStatus",
    "PortInfo",
    "TemplateRequest",
    "Volume",
    "allowed_actions",
    "public_view",
]


class ApiKind(StrEnum):
    REST = "rest"  # REST v2 over the stdlib: the default, and what runs inside pods
    GRAPHQL = "graphql"  # the `runpod` SDK: spot pods and `--api graphql`


class PodStatus(StrEnum):
    PROVISIONING = "PROVISIONING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    ERROR = "ERROR"
    TERMINATED = "TERMINATED"
    UNKNOWN = "UNKNOWN"  # a status RunPod's spec does not list, or none at all: read again, never ERROR


class PodAction(StrEnum):
    START = "start"
    STOP = "stop"
    RESTART = "restart"
    TERMINATE = "terminate"


_ALLOWED = {
    PodStatus.RUNNING: (PodAction.STOP, PodAction.RESTART, PodAction.TERMINATE),
    PodStatus.EXITED: (PodAction.START, PodAction.TERMINATE),
    PodStatus.ERROR: (PodAction.START, PodAction.TERMINATE),
    PodStatus.PROVISIONING: (PodAction.STOP, PodAction.TERMINATE),
    PodStatus.STARTING: (PodAction.STOP, PodAction.TERMINATE),
    PodStatus.TERMINATED: (),
    PodStatus.UNKNOWN: (),
}


def allowed_actions(status: PodStatus) -> tuple[PodAction, ...]:
    """The transitions REST v2 documents for a status (used where an API does not list them)."""
    return _ALLOWED[status]


@dataclass(frozen=True)
class GpuInfo:
    type: str
    count: int


@dataclass(frozen=True)
class CpuInfo:
    id: str
    vcpus: int


@dataclass(frozen=True)
class PortInfo:
    private: int
    public: int | None
    type: str
    ip: str | None


@dataclass(frozen=True)
class Volume:
    """A mount: a network volume (`volume_id`) or host-local persistent storage (`size_gb`)."""

    path: str
    volume_id: str | None = None
    size_gb: int | None = None

    @property
    def network(self) -> bool:
        return self.volume_id is not None


@dataclass(frozen=True)
class Pod:
    id: str
    name: str
    status: PodStatus
    gpu: GpuInfo | None
    cost_per_hr: float | None
    ssh: str | None
    ports: tuple[PortInfo, ...]
    actions: tuple[PodAction, ...]
    image: str = ""
    args: str = ""
    env: dict[str, str] = field(default_factory=dict)
    port_specs: tuple[str, ...] = ()
    disk_gb: int | None = None
    cloud: str | None = None
    data_center: str | None = None
    volume: Volume | None = None
    cpu: CpuInfo | None = None
    interruptible: bool = False
    started_at: str | None = None
    created_at: str | None = None
    cluster_id: str | None = None  # an Instant Cluster member: REST v2's `cluster {id, rank, ip}`
    cluster_rank: int | None = None
    has_runtime: bool | None = None  # REST v2 `runtime` is an object (the container runs) or null; None: not told
    container_uptime_s: int | None = None  # REST v2 `runtime.uptime`: seconds since the container started
    status_text: str = ""  # the status as the API spelled it (differs from `status` only when that is UNKNOWN)

    def uptime_s(self, now: float | None = None) -> float | None:
        """Seconds running since its last start: None unless RUNNING with a start time in the API."""
        return seconds_since(self.started_at, now) if self.status is PodStatus.RUNNING else None

    def spent_usd(self, now: float | None = None) -> float | None:
        """What it has cost since its last start (cost_per_hr x uptime), an estimate."""
        return cost_of(self.cost_per_hr, self.uptime_s(now))


# The `--json` view: what docs/formats.md promises plus a few useful fields. Never `env` (it may hold secrets).
_PUBLIC = ("id", "name", "status", "gpu", "cost_per_hr", "ssh", "ports", "actions", "image", "data_center")


def public_view(pod: Pod) -> dict[str, Any]:
    data = asdict(pod)
    view = {k: data[k] for k in _PUBLIC}
    view["ports"] = list(view["ports"])
    view["actions"] = [str(a) for a in pod.actions]
    view["status"] = str(pod.status)
    view["started_at"] = pod.started_at
    up, spent = pod.uptime_s(), pod.spent_usd()
    view["uptime_s"] = None if up is None else round(up, 1)
    view["spent_usd"] = None if spent is None else round(spent, 4)
    return view


@dataclass(frozen=True)
class PodRequest:
    """One create attempt: exactly one of `gpu`/`cpu`, at most one data centre."""

    name: str
    image: str
    args: str = ""
    env: dict[str, str] = field(default_factory=dict)
    ports: tuple[str, ...] = ()
    disk_gb: int = 50
    cloud: str = "SECURE"
    data_center: str | None = None
    gpu: GpuInfo | None = None
    cpu: CpuInfo | None = None
    volume: Volume | None = None
    ssh: bool = True
    interruptible: bool = False
    bid_per_gpu: float | None = None

    def describe(self) -> str:
        what = f"{self.gpu.count}x {self.gpu.type}" if self.gpu else f"CPU {self.cpu.id if self.cpu else '?'}"
        return f"{what} in {self.data_center or 'any data centre'}"


@dataclass(frozen=True)
class TemplateRequest:
    name: str
    image: str
    args: str
    env: dict[str, str]
    ports: tuple[str, ...]
    disk_gb: int
    volume: Volume | None
    ssh: bool
    category: str  # NVIDIA | CPU


@dataclass(frozen=True)
class LogEvent:
    """One line of a pod's log stream (REST v2 SSE: `{"ts", "source", "line"}`, id = resume cursor)."""

    line: str
    ts: str = ""
    source: str = ""
    id: str = ""

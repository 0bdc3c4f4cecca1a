"""Pod spec files (`runpod/pod.toml`, docs/running-pods.md): parsed and fully checked before any request is sent.

    spec = load_spec(Path("runpod/pod.toml"))     # UsageError (exit 64) naming the key and what is valid
    for request in spec.candidates(): ...          # GPU types in order, within each data centre in order

Unknown keys are errors that name the key. Values pass through untouched (RunPod secret references like
`{{ RUNPOD_SECRET_hf_token }}` included); encoding them for an API is the API module's job.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from podguard.errors import UsageError
from podguard.pods.checkpoint_env import checkpoints_env, store_of
from podguard.pods.clusters.cluster import CLUSTER_TYPES, MAX_NODES, MIN_NODES, ClusterRequest, ClusterShape
from podguard.pods.limits import limits_env
from podguard.pods.pod import CpuInfo, GpuInfo, PodRequest, TemplateRequest, Volume

__all__ = ["PodSpec", "load_spec", "parse_spec"]

_TOP = {
    "name",
    "image",
    "args",
    "cloud",
    "data_centers",
    "disk_gb",
    "ports",
    "ssh",
    "interruptible",
    "bid_per_gpu",
    "template",
    "gpu",
    "cpu",
    "volume",
    "network_volume",
    "env",
    "limits",
    "checkpoints",
    "ready",
    "cluster",
}
_TABLES = {
    "gpu": {"types", "count"},
    "cpu": {"id", "vcpus"},
    "volume": {"size_gb", "path"},
    "network_volume": {"id", "path"},
    "ready": {"timeout_s"},
    "limits": {"idle_stop", "max_runtime", "max_cost_usd", "hang_timeout", "restarts"},
    "cluster": {"nodes", "type"},
    "checkpoints": {"dir", "store", "keep", "save_signal", "save_grace"},
}
_PORT = re.compile(r"^(\d{1,5})/(tcp|http)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CLOUDS = ("SECURE", "COMMUNITY")
MAX_GPUS = 16


@dataclass(frozen=True)
class PodSpec:
    name: str
    image: str
    args: str = "train"
    cloud: str = "SECURE"
    data_centers: tuple[str, ...] = ()
    disk_gb: int = 50
    ports: tuple[str, ...] = ("22/tcp",)
    ssh: bool = True
    interruptible: bool = False
    bid_per_gpu: float | None = None
    template: str = ""
    gpu: GpuInfo | None = None
    gpu_types: tuple[str, ...] = ()
    cpu: CpuInfo | None = None
    volume: Volume | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 1800.0
    cluster: ClusterShape | None = None  # [cluster]: a RunPod Instant Cluster of `nodes` such pods

    @property
    def store(self) -> str:
        """The checkpoint store its pods mirror to (`[checkpoints] store`, or `[env]`), "" when none."""
        return store_of(self.env)

    def cluster_candidates(self) -> list[ClusterRequest]:
        """One cluster create attempt per (data centre, GPU type), in the spec's order; every node alike."""
        assert self.cluster is not None and self.gpu is not None
        return [
            ClusterRequest(
                name=self.name,
                type=self.cluster.type,
                image=self.image,
                gpu=GpuInfo(gpu_type, self.gpu.count),
                nodes=self.cluster.nodes,
                args=self.args,
                env=dict(self.env),
                ports=self.ports,
                disk_gb=self.disk_gb,
                data_center=dc,
                volume=self.volume,
                ssh=self.ssh,
            )
            for dc in self.data_centers or (None,)
            for gpu_type in self.gpu_types
        ]

    def candidates(self) -> list[PodRequest]:
        """One create attempt per (data centre, GPU type), GPU types first, both in the spec's order."""
        common = dict(
            name=self.name,
            image=self.image,
            args=self.args,
            env=dict(self.env),
            ports=self.ports,
            disk_gb=self.disk_gb,
            cloud=self.cloud,
            volume=self.volume,
            ssh=self.ssh,
            interruptible=self.interruptible,
            bid_per_gpu=self.bid_per_gpu,
        )
        out: list[PodRequest] = []
        for dc in self.data_centers or (None,):
            if self.cpu is not None:
                out.append(PodRequest(**common, data_center=dc, cpu=self.cpu))  # type: ignore[arg-type]
            for gpu_type in self.gpu_types:
                gpu = GpuInfo(gpu_type, self.gpu.count if self.gpu else 1)
                out.append(PodRequest(**common, data_center=dc, gpu=gpu))  # type: ignore[arg-type]
        return out

    def template_request(self) -> TemplateRequest:
        return TemplateRequest(
            name=self.template or self.name,
            image=self.image,
            args=self.args,
            env=dict(self.env),
            ports=self.ports,
            disk_gb=self.disk_gb,
            volume=self.volume if self.volume is not None and not self.volume.network else None,
            ssh=self.ssh,
            category="CPU" if self.cpu is not None else "NVIDIA",
        )


def load_spec(path: Path) -> PodSpec:
    """Read and check a spec file; UsageError naming the file, the key and what is valid."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--spec {str(path)!r} does not exist; example specs are in runpod/") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--spec {str(path)!r} cannot be read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    return parse_spec(data, where=str(path))


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, problem: str) -> UsageError:
        return UsageError(f"{self.where}: {key} {problem}")

    def string(self, table: Mapping[str, Any], key: str, name: str, *, default: str | None = None) -> str:
        value = table.get(key, default)
        if value is None:
            raise self.fail(name, "is required (a string)")
        if not isinstance(value, str):
            raise self.fail(name, f"= {value!r} is not valid; expected a string")
        return value

    def whole(self, table: Mapping[str, Any], key: str, name: str, default: int, lo: int, hi: int | None) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            valid = f"{lo}-{hi}" if hi is not None else f">= {lo}"
            raise self.fail(name, f"= {value!r} is not valid; expected a whole number {valid}")
        return value

    def number(self, table: Mapping[str, Any], key: str, name: str, default: float | None) -> float | None:
        value = table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < float("inf")):
            raise self.fail(name, f"= {value!r} is not valid; expected a number > 0")
        return float(value)

    def flag(self, table: Mapping[str, Any], key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"= {value!r} is not valid; expected true or false")
        return value

    def strings(self, table: Mapping[str, Any], key: str, name: str, check: Callable[[str], bool]) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and check(v) for v in value):
            raise self.fail(name, f"= {value!r} is not valid; expected a list of strings")
        if len(set(value)) != len(value):
            raise self.fail(name, f"= {value!r} names an entry twice")
        return tuple(value)

    def table(self, data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, "must be a table, e.g. [" + key + "]")
        unknown = sorted(set(value) - _TABLES.get(key, set(value)))
        if unknown:
            valid = ", ".join(sorted(_TABLES[key]))
            raise self.fail(f"[{key}] {unknown[0]}", f"is not a known key (valid in [{key}]: {valid})")
        return value


def parse_spec(data: Mapping[str, Any], *, where: str = "spec") -> PodSpec:
    """Check a parsed TOML document against the spec format; the first problem is a UsageError."""
    c = _Checker(where)
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise c.fail(unknown[0], f"is not a known key (valid: {', '.join(sorted(_TOP))})")
    name = c.string(data, "name", "name")
    if not name.strip() or len(name) > 191 or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise c.fail("name", f"= {name!r} is not valid; expected 1-191 printable characters")
    image = c.string(data, "image", "image")
    if not image or any(ch.isspace() for ch in image):
        raise c.fail("image", f"= {image!r} is not valid; expected an image reference without spaces")
    cloud = c.string(data, "cloud", "cloud", default="SECURE")
    if cloud not in CLOUDS:
        raise c.fail("cloud", f"= {cloud!r} is not valid; expected one of {', '.join(CLOUDS)}")
    ports = c.strings(data, "ports", "ports", _valid_port) if "ports" in data else PodSpec.ports
    interruptible = c.flag(data, "interruptible", False)
    bid = c.number(data, "bid_per_gpu", "bid_per_gpu", None)
    if bid is not None and not interruptible:
        raise c.fail("bid_per_gpu", "only applies to spot pods; set interruptible = true or remove it")
    spec = PodSpec(
        name=name,
        image=image,
        args=c.string(data, "args", "args", default="train"),
        cloud=cloud,
        data_centers=c.strings(
            data, "data_centers", "data_centers", lambda v: bool(v) and not any(map(str.isspace, v))
        ),
        disk_gb=c.whole(data, "disk_gb", "disk_gb", 50, 1, None),
        ports=ports,
        ssh=c.flag(data, "ssh", True),
        interruptible=interruptible,
        bid_per_gpu=bid,
        template=c.string(data, "template", "template", default=""),
        env=_checkpoints(c, data, _limits(c, data, _env(c, data))),
        ready_timeout_s=_ready(c, data),
    )

    shape = _cluster(c, data, spec)  # before [gpu]/[cpu]: a cluster's own refusals come first
    return replace(_compute(c, data, spec), cluster=shape)


def _cluster(c: _Checker, data: Mapping[str, Any], spec: PodSpec) -> ClusterShape | None:
    """The [cluster] table: nodes 2..250, type; GPU nodes only, never spot."""
    table = c.table(data, "cluster")
    if table is None:
        return None
    nodes = table.get("nodes")
    if nodes is None:
        raise c.fail("[cluster] nodes", f"is required: the number of nodes, {MIN_NODES}-{MAX_NODES}")
    nodes = c.whole(table, "nodes", "[cluster] nodes", MIN_NODES, MIN_NODES, MAX_NODES)
    kind = c.string(table, "type", "[cluster] type", default="TRAINING")
    if kind not in CLUSTER_TYPES:
        raise c.fail("[cluster] type", f"= {kind!r} is not valid; expected one of {', '.join(CLUSTER_TYPES)}")
    if "cpu" in data:
        raise c.fail("[cpu]", "is refused with [cluster]: Instant Cluster nodes are GPU pods; use [gpu]")
    if spec.interruptible:
        raise c.fail("interruptible", "is refused with [cluster]: Instant Clusters have no spot nodes; remove it")
    if "gpu" not in data:
        raise c.fail("[cluster]", "needs a [gpu] table: the GPU types to try and `count`, the GPUs per node")
    if (where := _restarts_in(data, spec.args)) is not None:
        raise c.fail(
            where,
            "is refused with [cluster]: it relaunches one node's job, which the other nodes do not follow; use "
            'torchrun\'s --max-restarts (e.g. args = "train --mode torchrun --max-restarts 2 -- python train.py"), '
            "which restarts every node's workers together",
        )
    return ClusterShape(nodes=nodes, type=kind)


def _restarts_in(data: Mapping[str, Any], args: str) -> str | None:
    """Where a cluster spec asks for podguard's own restarts: `[limits] restarts`, `--restarts N` among podguard's
    arguments (before `--`: after it the words are the job's), or `[env] PODGUARD_RESTARTS`; None when nowhere
    (0 asks for none)."""
    limits = data.get("limits")
    if isinstance(limits, dict) and "restarts" in limits:
        return "[limits] restarts"
    words = shlex.split(args) if args else []
    words = words[: words.index("--")] if "--" in words else words
    for i, word in enumerate(words):
        value = word.partition("=")[2] if word.startswith("--restarts=") else None
        if word == "--restarts":
            value = words[i + 1] if i + 1 < len(words) else ""
        if value is not None and value.strip() not in ("0", ""):
            return f"args {word if '=' in word else f'{word} {value}'!r}"
    env = data.get("env")
    if isinstance(env, dict) and str(env.get("PODGUARD_RESTARTS", "")).strip() not in ("", "0"):
        return "[env] PODGUARD_RESTARTS"
    return None


def _valid_port(value: str) -> bool:
    m = _PORT.match(value)
    return bool(m) and 1 <= int(m.group(1)) <= 65535


def _env(c: _Checker, data: Mapping[str, Any]) -> dict[str, str]:
    env = data.get("env", {})
    if not isinstance(env, dict):
        raise c.fail("env", "must be a table, e.g. [env]")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise c.fail(
                f"[env] {key!r}", "is not a valid variable name (letters, digits, _; not starting with a digit)"
            )
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)
        if not isinstance(value, str):
            raise c.fail(f"[env] {key}", "must be a string, number or boolean")
        out[key] = value
    return out


def _limits(c: _Checker, data: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]:
    """[limits]: the billing guards and the run's watch, passed to the pod as PODGUARD_* variables (pods/limits.py)."""
    return {**env, **limits_env(c.table(data, "limits") or {}, env, where=c.where)}


def _checkpoints(c: _Checker, data: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]:
    """[checkpoints]: the job's checkpoints and their store, passed as PODGUARD_* variables (pods/checkpoint_env.py)."""
    return {**env, **checkpoints_env(c.table(data, "checkpoints") or {}, env, where=c.where)}


def _ready(c: _Checker, data: Mapping[str, Any]) -> float:
    ready = c.table(data, "ready") or {}
    value = c.number(ready, "timeout_s", "[ready] timeout_s", 1800.0)
    assert value is not None
    return value


def _compute(c: _Checker, data: Mapping[str, Any], spec: PodSpec) -> PodSpec:
    """The [gpu]/[cpu] and [volume]/[network_volume] tables, and the rules that tie them together."""
    gpu_t, cpu_t = c.table(data, "gpu"), c.table(data, "cpu")
    if (gpu_t is None) == (cpu_t is None):
        raise c.fail("[gpu]/[cpu]", "exactly one of the two tables is required (a GPU pod or a CPU pod)")
    gpu = cpu = None
    types: tuple[str, ...] = ()
    if gpu_t is not None:
        types = c.strings(gpu_t, "types", "[gpu] types", lambda v: bool(v.strip()))
        if not types:
            raise c.fail("[gpu] types", 'is required: GPU type ids in order of preference, e.g. ["NVIDIA A40"]')
        gpu = GpuInfo(types[0], c.whole(gpu_t, "count", "[gpu] count", 1, 1, MAX_GPUS))
    if cpu_t is not None:
        cpu_id = c.string(cpu_t, "id", "[cpu] id")
        vcpus = c.whole(cpu_t, "vcpus", "[cpu] vcpus", 2, 2, 512)
        if not cpu_id.strip() or vcpus & (vcpus - 1):
            raise c.fail("[cpu]", f"id = {cpu_id!r}, vcpus = {vcpus} is not valid; expected an id and a power of two")
        cpu = CpuInfo(cpu_id, vcpus)
        if spec.interruptible:
            raise c.fail("interruptible", "is for GPU pods only; remove it or use a [gpu] table")
    vol_t, net_t = c.table(data, "volume"), c.table(data, "network_volume")
    if vol_t is not None and net_t is not None:
        raise c.fail("[volume]/[network_volume]", "give one of the two, not both")
    volume = None
    if vol_t is not None:
        if cpu is not None:
            raise c.fail("[volume]", "is not available on CPU pods; use [network_volume]")
        volume = Volume(
            path=_path(c, vol_t, "[volume] path"), size_gb=c.whole(vol_t, "size_gb", "[volume] size_gb", 20, 10, None)
        )
    if net_t is not None:
        vid = c.string(net_t, "id", "[network_volume] id")
        if not vid.strip():
            raise c.fail("[network_volume] id", "must not be empty")
        volume = Volume(path=_path(c, net_t, "[network_volume] path"), volume_id=vid)
    return replace(spec, gpu=gpu, gpu_types=types, cpu=cpu, volume=volume)


def _path(c: _Checker, table: Mapping[str, Any], name: str) -> str:
    path = c.string(table, "path", name, default="/workspace")
    if not path.startswith("/") or any(ord(ch) < 0x20 for ch in path):
        raise c.fail(name, f"= {path!r} is not valid; expected an absolute path like /workspace")
    return path

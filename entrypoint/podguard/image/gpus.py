"""GPUs for local containers: the `--gpus` value, the engine's device request, and who holds which GPU.

    want = parse_gpus("0,1")                  # all | N (a count, like `docker run --gpus N`) | LIST | none
    want.device_request()                     # docker.types.DeviceRequest for containers.run
    find_holders(client, want, skip={"llm-train"})   # running containers whose GPUs overlap `want`

A container holds GPUs through its device requests (`--gpus`), or through the NVIDIA runtime and
NVIDIA_VISIBLE_DEVICES (the older `--runtime nvidia` form). A count N means the first N GPUs (what the
NVIDIA hook gives). Indices and UUIDs cannot be compared without the driver, so they count as overlapping:
a container that may hold the GPU is reported rather than missed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from podguard.errors import UsageError
from podguard.image import LABEL_MANAGED

if TYPE_CHECKING:
    import docker

__all__ = ["GpuHolder", "GpuSet", "find_holders", "holdings", "parse_gpus"]

_ID = re.compile(r"^(\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F/-]+)$")


@dataclass(frozen=True)
class GpuSet:
    """GPUs by index or UUID; `everything` for all of the host's; empty for none."""

    ids: frozenset[str] = frozenset()
    everything: bool = False
    count: int | None = None  # how the user asked, kept for the device request

    @property
    def empty(self) -> bool:
        return not self.everything and not self.ids

    def describe(self) -> str:
        if self.everything:
            return "all GPUs"
        if self.empty:
            return "no GPU"
        return "GPU " + ",".join(sorted(self.ids, key=lambda i: (not i.isdigit(), int(i) if i.isdigit() else 0, i)))

    def overlaps(self, other: GpuSet) -> bool:
        if self.empty or other.empty:
            return False
        if self.everything or other.everything or self.ids & other.ids:
            return True
        # An index on one side and a UUID on the other: cannot tell without the driver, so "maybe".
        return any(i.isdigit() for i in self.ids) != any(i.isdigit() for i in other.ids)

    @classmethod
    def first(cls, n: int) -> GpuSet:
        """The first `n` GPUs (what the NVIDIA hook gives for a count)."""
        return cls(ids=frozenset(str(i) for i in range(n)), count=n)

    def device_request(self) -> Any:
        import docker  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

        if self.everything:
            return docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])
        if self.count is not None:
            return docker.types.DeviceRequest(count=self.count, capabilities=[["gpu"]])
        return docker.types.DeviceRequest(device_ids=sorted(self.ids), capabilities=[["gpu"]])


def _from_ids(values: Iterable[str], what: str) -> GpuSet:
    ids = [v.strip() for v in values if v.strip()]
    bad = [v for v in ids if not _ID.match(v)]
    if bad:
        raise UsageError(f"{what}: {bad[0]!r} is not a GPU index or UUID (e.g. 0, GPU-8f3c...)")
    return GpuSet(ids=frozenset(ids))


def parse_gpus(raw: str) -> GpuSet:
    """`all`, `none`, `N` (the first N GPUs, as `docker run --gpus N`), `0,2` / `device=2` (these GPUs)."""
    text = raw.strip()
    where = f"--gpus {raw!r}"
    if text == "all":
        return GpuSet(everything=True)
    if text == "none":
        return GpuSet()
    if text.isdigit():
        if int(text) < 1:
            raise UsageError(
                f"{where} is not valid: a bare number is a count, as in `docker run --gpus N`; "
                "for GPU 0 write device=0, for no GPU none"
            )
        return GpuSet.first(int(text))
    if text.startswith("device="):
        text = text.removeprefix("device=")
    if not text:
        raise UsageError(f"{where} is not valid; expected all, none, a count N, or a list such as 0,1")
    return _from_ids(text.split(","), where)


def _from_visible_devices(value: str | None) -> GpuSet:
    if value is None or value.strip() in ("", "none", "void"):
        return GpuSet()
    if value.strip() == "all":
        return GpuSet(everything=True)
    return GpuSet(ids=frozenset(v.strip() for v in value.split(",") if v.strip()))


def holdings(attrs: dict[str, Any]) -> GpuSet:
    """The GPUs a container (its `docker inspect` data) was given."""
    host = attrs.get("HostConfig") or {}
    held = GpuSet()
    for req in host.get("DeviceRequests") or []:
        caps = {c for group in req.get("Capabilities") or [] for c in group}
        if req.get("Driver") != "nvidia" and "gpu" not in caps:
            continue
        if req.get("DeviceIDs"):
            held = _merge(held, GpuSet(ids=frozenset(req["DeviceIDs"])))
        elif int(req.get("Count") or 0) < 0:
            return GpuSet(everything=True)
        elif int(req.get("Count") or 0) > 0:
            held = _merge(held, GpuSet.first(int(req["Count"])))
    if host.get("Runtime") == "nvidia":
        env = dict(e.split("=", 1) for e in (attrs.get("Config") or {}).get("Env") or [] if "=" in e)
        held = _merge(held, _from_visible_devices(env.get("NVIDIA_VISIBLE_DEVICES")))
    return held


def _merge(a: GpuSet, b: GpuSet) -> GpuSet:
    if a.everything or b.everything:
        return GpuSet(everything=True)
    return GpuSet(ids=a.ids | b.ids)


@dataclass(frozen=True)
class GpuHolder:
    """A running container that holds (or may hold) GPUs we want."""

    name: str
    short_id: str
    image: str
    gpus: GpuSet
    managed: bool  # started by podguard (labelled): podguard may stop it


def find_holders(client: docker.DockerClient, want: GpuSet, skip: Iterable[str] = ()) -> list[GpuHolder]:
    """Running containers whose GPUs overlap `want` (containers named in `skip` excepted)."""
    skipped = set(skip)
    found = []
    for container in client.containers.list():  # running only
        if container.name in skipped:
            continue
        held = holdings(container.attrs)
        if held.overlaps(want):
            labels = container.labels or {}
            image = (container.attrs.get("Config") or {}).get("Image", "")
            found.append(
                GpuHolder(container.name, container.short_id, image, held, labels.get(LABEL_MANAGED) == "true")
            )
    return found

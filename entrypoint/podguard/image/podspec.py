"""A pod spec (`runpod/pod.toml`, docs/running-pods.md) as `podguard image run` needs it to run the pod locally.

The file is read and checked by the pods package's parser (`podguard.pods.spec.load_spec`: unknown keys and
bad values are errors naming them); this module only derives the local view of it.

    spec = read_pod_spec(Path("runpod/pod.toml"))
    spec.name, spec.image, spec.command, spec.ports, spec.env, spec.volume_path, spec.gpu_count
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from podguard.errors import UsageError
from podguard.pods.spec import PodSpec, load_spec

__all__ = ["LocalPodSpec", "local_view", "parse_port", "read_pod_spec"]


@dataclass(frozen=True)
class LocalPodSpec:
    name: str
    image: str
    command: tuple[str, ...]  # the container's arguments (`args`, word-split)
    ports: tuple[str, ...]  # Docker form: "22/tcp", "8888/tcp"
    env: dict[str, str]
    volume_path: str | None  # where the pod's volume is mounted, None when the spec has none
    gpu_count: int | None  # None for a CPU pod
    ssh: bool = True  # the spec's `ssh`: PUBLIC_KEY is passed only when true


def parse_port(raw: str) -> str:
    """`8888/http` -> `8888/tcp`: an HTTP port is a TCP port on this host (RunPod adds the proxy)."""
    number, _, proto = raw.strip().partition("/")
    if not number.isdigit() or not 0 < int(number) < 65536 or proto not in ("tcp", "http"):
        raise UsageError(f"port {raw!r} is not valid; expected PORT/tcp or PORT/http, e.g. 22/tcp")
    return f"{int(number)}/tcp"


def local_view(spec: PodSpec) -> LocalPodSpec:
    try:
        command = tuple(shlex.split(spec.args))
    except ValueError as exc:
        raise UsageError(f"args = {spec.args!r} cannot be split into words: {exc}") from None
    return LocalPodSpec(
        name=spec.name,
        image=spec.image,
        command=command,
        ports=tuple(dict.fromkeys(parse_port(p) for p in spec.ports)),
        env=dict(spec.env),
        volume_path=spec.volume.path if spec.volume is not None else None,
        gpu_count=spec.gpu.count if spec.gpu is not None else None,
        ssh=spec.ssh,
    )


def read_pod_spec(path: Path) -> LocalPodSpec:
    return local_view(load_spec(path))

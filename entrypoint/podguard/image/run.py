"""`podguard image run`: run a pod spec's image on this Docker host the way RunPod would run it.

    result = run_pod(connect(), RunRequest(spec=read_pod_spec(path), gpus=parse_gpus("all")))

What RunPod gives a pod, reproduced: the spec's command, env and ports (published on 127.0.0.1, each on a
free host port), a named volume at the spec's volume path, `RUNPOD_POD_ID` (new for every container, like a
new pod), `RUNPOD_GPU_COUNT`, your `~/.ssh/*.pub` as `PUBLIC_KEY`, GPUs through device requests when the
engine has the NVIDIA runtime, and a restart policy that restarts the container whenever its command
exits (`unless-stopped`: like a pod, it stays stopped once you stop it). RunPod secret references
(`{{ RUNPOD_SECRET_name }}`) take the value of `RUNPOD_SECRET_name` from your environment, else the
variable is left out with a warning.

Before taking GPUs it looks for running containers that hold them: podguard's own (labelled) are stopped,
others only with `force` (else exit 75 naming them).
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.image import LABEL_MANAGED, LABEL_POD
from podguard.image.engine import engine_error, has_nvidia_runtime
from podguard.image.gpus import GpuHolder, GpuSet, find_holders
from podguard.image.podspec import LocalPodSpec
from podguard.pods import thispod

if TYPE_CHECKING:
    import docker

__all__ = ["RESTART_POLICY", "RunRequest", "RunResult", "container_name", "public_keys", "resolve_env", "run_pod"]

RESTART_POLICY = {"Name": "unless-stopped"}
STOP_TIMEOUT_S = 30
_SECRET_REF = re.compile(r"^\{\{\s*RUNPOD_SECRET_(?P<name>[A-Za-z0-9_]+)\s*\}\}$")
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]+")


@dataclass(frozen=True)
class RunRequest:
    spec: LocalPodSpec
    gpus: GpuSet | None = None  # None: what the spec asks for ([gpu] count, or none for [cpu])
    image: str | None = None  # overrides the spec's image (e.g. a local build)
    env: dict[str, str] = field(default_factory=dict)  # --env overrides, applied last
    bind: str = "127.0.0.1"
    force: bool = False
    shm_size: str | None = None  # None: half the host's memory


@dataclass(frozen=True)
class RunResult:
    name: str
    container_id: str
    pod_id: str
    image: str
    command: tuple[str, ...]
    gpus: str
    volume: str | None
    ports: dict[str, str]  # "22/tcp" -> "127.0.0.1:49153"
    replaced: str | None
    stopped: tuple[str, ...]
    notes: tuple[str, ...]


def container_name(spec: LocalPodSpec) -> str:
    return _NAME_CHARS.sub("-", spec.name).strip("-.") or "pod"


def public_keys(home: Path | None = None) -> str | None:
    """Every `~/.ssh/*.pub`, one per line, as RunPod's PUBLIC_KEY carries an account's keys."""
    folder = (home or Path.home()) / ".ssh"
    keys = []
    for path in sorted(folder.glob("*.pub")):
        try:
            keys += [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except OSError:
            continue
    return "\n".join(keys) or None


def resolve_env(env: dict[str, str], local: dict[str, str] | os._Environ[str]) -> tuple[dict[str, str], list[str]]:
    """Resolve RunPod secret references from `local`; returns (env, warnings naming what was left out)."""
    out, notes = {}, []
    for name, value in env.items():
        ref = _SECRET_REF.match(value)
        if ref is None:
            out[name] = value
        elif f"RUNPOD_SECRET_{ref.group('name')}" in local:
            out[name] = local[f"RUNPOD_SECRET_{ref.group('name')}"]
        else:
            notes.append(
                f"{name} refers to the RunPod secret {ref.group('name')!r}; set RUNPOD_SECRET_{ref.group('name')} "
                "here to pass it locally (left out)"
            )
    return out, notes


def _gpus(client: docker.DockerClient, req: RunRequest, notes: list[str]) -> GpuSet:
    """The GPUs to request: `--gpus`, else all of this host's for a [gpu] spec (its count is RunPod's, not
    this host's), none for a [cpu] one; a host without the NVIDIA runtime runs on CPU unless GPUs were
    asked for explicitly (exit 69)."""
    if req.gpus is not None:
        want = req.gpus
    else:
        want = GpuSet(everything=req.spec.gpu_count is not None)
    if want.empty or has_nvidia_runtime(client):
        return want
    if req.gpus is not None:
        raise PodguardError(
            f"--gpus asks for {want.describe()} but this Docker engine has no NVIDIA runtime "
            "(install the NVIDIA container toolkit, or pass --gpus none to run on CPU)",
            ExitCode.GPUS_MISSING,
        )
    notes.append("no NVIDIA runtime on this Docker engine: running on CPU")
    return GpuSet()


def _gpu_holders(client: docker.DockerClient, want: GpuSet, req: RunRequest, name: str) -> list[GpuHolder]:
    """Running containers on `want`; 75 (nothing done yet) when some are not podguard's and not `force`."""
    holders = find_holders(client, want, skip={name}) if not want.empty else []
    foreign = [h for h in holders if not h.managed]
    if foreign and not req.force:
        listed = "; ".join(f"{h.name} ({h.short_id}, {h.image}, {h.gpus.describe()})" for h in foreign)
        raise PodguardError(
            f"{want.describe()} in use by containers podguard did not start: {listed}; "
            "stop them, or pass --force to have podguard stop them",
            ExitCode.GPUS_BUSY,
        )
    return holders


def _stop_holders(client: docker.DockerClient, holders: list[GpuHolder]) -> list[str]:
    for holder in holders:
        who = "started by podguard" if holder.managed else "not podguard's; --force"
        console.say(f"stopping {holder.name} ({holder.short_id}, {who}): it holds {holder.gpus.describe()}")
        client.containers.get(holder.name).stop(timeout=STOP_TIMEOUT_S)
    return [h.name for h in holders]


def _previous(client: docker.DockerClient, name: str, force: bool) -> Any:
    """This pod's previous container (to replace), None; 64 when the name is taken by someone else's."""
    from docker.errors import NotFound  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    try:
        old = client.containers.get(name)
    except NotFound:
        return None
    if (old.labels or {}).get(LABEL_MANAGED) != "true" and not force:
        raise UsageError(
            f"a container named {name!r} exists and podguard did not start it; rename the pod in the spec "
            "or pass --force to replace it"
        )
    return old


def _ensure_image(client: docker.DockerClient, image: str) -> None:
    """Pull the image when this host does not have it, before anything is stopped or replaced."""
    from docker.errors import DockerException, ImageNotFound  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    try:
        client.images.get(image)
        return
    except ImageNotFound:
        console.say(f"pulling {image}")
    try:
        client.images.pull(image)
    except DockerException as exc:
        raise UsageError(
            f"image {image!r} is not on this host and cannot be pulled: {str(exc).splitlines()[0]}"
        ) from None


def _volume(client: docker.DockerClient, spec: LocalPodSpec, name: str) -> dict[str, Any]:
    if spec.volume_path is None:
        return {}
    volume = f"{name}-volume"
    if not client.volumes.list(filters={"name": f"^{re.escape(volume)}$"}):
        client.volumes.create(volume, labels={LABEL_MANAGED: "true", LABEL_POD: spec.name})
    return {volume: {"bind": spec.volume_path, "mode": "rw"}}


def _environment(req: RunRequest, pod_id: str, gpus: GpuSet, notes: list[str]) -> dict[str, str]:
    env, missing = resolve_env(req.spec.env, os.environ)
    notes += missing
    env[thispod.ENV_POD_ID] = pod_id
    if not gpus.everything:  # "all": the preflight counts what the container sees
        env["RUNPOD_GPU_COUNT"] = str(gpus.count or len(gpus.ids))
    if req.spec.ssh and "PUBLIC_KEY" not in env and "PUBLIC_KEY" not in req.env:
        keys = public_keys()
        if keys:
            env["PUBLIC_KEY"] = keys
        elif "22/tcp" in req.spec.ports:
            notes.append("no ~/.ssh/*.pub found: PUBLIC_KEY is not set, so sshd will not start")
    env.update(req.env)
    return env


def run_pod(client: docker.DockerClient, req: RunRequest) -> RunResult:
    from docker.errors import DockerException  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    name, notes = container_name(req.spec), []
    image = req.image or req.spec.image
    try:
        gpus = _gpus(client, req, notes)
        _ensure_image(client, image)
        # Everything that can refuse comes first: a refusal leaves the host as it was.
        holders = _gpu_holders(client, gpus, req, name)
        previous = _previous(client, name, req.force)
        if previous is not None:
            previous.remove(force=True)
        stopped = _stop_holders(client, holders)
        pod_id = secrets.token_hex(7)
        volumes = _volume(client, req.spec, name)
        memory = int(client.info().get("MemTotal") or 0)
        container = client.containers.run(
            image,
            list(req.spec.command),
            name=name,
            hostname=pod_id,
            detach=True,
            environment=_environment(req, pod_id, gpus, notes),
            ports={port: (req.bind, None) for port in req.spec.ports},
            volumes=volumes,
            device_requests=None if gpus.empty else [gpus.device_request()],
            restart_policy=RESTART_POLICY,
            shm_size=req.shm_size or max(memory // 2, 64 << 20),
            labels={LABEL_MANAGED: "true", LABEL_POD: req.spec.name},
        )
        container.reload()
    except DockerException as exc:
        raise engine_error(exc, f"starting {name} from {image}") from None
    mapped = {
        port: f"{b[0]['HostIp']}:{b[0]['HostPort']}"
        for port, b in (container.attrs["NetworkSettings"]["Ports"] or {}).items()
        if b
    }
    return RunResult(
        name=name,
        container_id=container.id,
        pod_id=pod_id,
        image=image,
        command=req.spec.command,
        gpus=gpus.describe(),
        volume=next(iter(volumes), None),
        ports=mapped,
        replaced=previous.short_id if previous is not None else None,
        stopped=tuple(stopped),
        notes=tuple(notes),
    )

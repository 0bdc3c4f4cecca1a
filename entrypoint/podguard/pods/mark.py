"""podguard's mark on what it creates: which pods (clusters) of a name are podguard's to touch.

    spec = marked_spec(spec, keep="k3-9f2a1c")         # its env carries PODGUARD_MARK for spec.name
    mark = mark_of(pod.env)                             # Mark(name=..., keep="k3-9f2a1c", spec="1a2b...", gpus=2)
    owned(pod, "llm-train")                             # True: podguard may start, stop, terminate or adopt it
    stranger_line(pod)                                  # "pod abc123 (image ..., RUNNING)": how a refusal names it

Every pod and cluster podguard creates (`pod up`, `pod keep`, `pod heal --replace`, the in-pod self-heal's
replacement, the `<name>-keeper` pod) carries `PODGUARD_MARK` in its env:
`podguard/1 name=<hash of the name> keep=<the keep's identity> spec=<hash of the spec> gpus=<GPU count>`.
REST v2 returns a pod's `env` on `GET /v2/pods` and `GET /v2/pods/{id}` (a required field of the Pod object in
RunPod's OpenAPI, runpod/docs `api-reference-v2/openapi.json`); a cluster's mark is read from its member pods.
A pod of the name without the mark is the user's: podguard never touches it unless it was adopted explicitly
(`--adopt POD_ID`, written in the keep's record). The name is in the mark as a hash, so a pod that is renamed
(or whose env was copied into another pod) is not mistaken for the name's; `gpus` is the GPU count the pod was
made with, so that a spec edited since is never read as a host that gave the pod fewer GPUs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Protocol

from podguard.pods.spec import PodSpec

__all__ = [
    "ENV_MARK",
    "Mark",
    "Marked",
    "kept_or_marked",
    "mark_of",
    "marked_spec",
    "name_hash",
    "owned",
    "spec_hash",
    "stranger_line",
    "with_mark",
]

ENV_MARK = "PODGUARD_MARK"
VERSION = "podguard/1"


class Marked(Protocol):
    """What a mark is read from: a Pod (a cluster's member pod)."""

    @property
    def id(self) -> str: ...

    @property
    def env(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Mark:
    name: str  # the hash of the name it was made for (name_hash)
    keep: str  # the keep's identity ("k7-3fa9c2" for a `pod keep`, "up" for `pod up`, "heal" ...)
    spec: str = ""  # the hash of the spec it was made from ("" when not made from a spec: a heal of a bare pod)
    gpus: int | None = None  # the GPU count it was made with (None: a CPU pod, or not known)

    def text(self) -> str:
        gpus = f" gpus={self.gpus}" if self.gpus is not None else ""
        return f"{VERSION} name={self.name} keep={self.keep} spec={self.spec or '-'}{gpus}"


def name_hash(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]


def spec_hash(spec: PodSpec) -> str:
    """The hash of what shapes the pod (image, args, GPUs, disk, ports, env, volume, cluster ...), never the mark."""
    data = asdict(replace(spec, env={k: v for k, v in spec.env.items() if k != ENV_MARK}))
    data.pop("ready_timeout_s", None)  # how long `pod up` waits does not shape the pod
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def mark_of(env: Mapping[str, str]) -> Mark | None:
    """The mark in a pod's env; None when there is none or it does not read as one."""
    raw = env.get(ENV_MARK, "")
    words = raw.split()
    if not words or words[0] != VERSION:
        return None
    fields = dict(w.partition("=")[::2] for w in words[1:] if "=" in w)
    if not fields.get("name") or not fields.get("keep"):
        return None
    gpus = fields.get("gpus", "")
    spec = fields.get("spec", "")
    return Mark(fields["name"], fields["keep"], "" if spec == "-" else spec, int(gpus) if gpus.isdigit() else None)


def owned(pod: Marked, name: str, adopted: Collection[str] = ()) -> bool:
    """podguard's to touch: it carries the mark of `name`, or the user adopted it (`--adopt`)."""
    if pod.id in adopted:
        return True
    mark = mark_of(pod.env)
    return mark is not None and mark.name == name_hash(name)


def with_mark(env: Mapping[str, str], mark: Mark) -> dict[str, str]:
    return {**{k: v for k, v in env.items() if k != ENV_MARK}, ENV_MARK: mark.text()}


def kept_or_marked(env: Mapping[str, str], name: str, gpus: int | None, *, made_by: str) -> dict[str, str]:
    """A copy's env (a heal's replacement pod or cluster): the original's mark kept (a replacement is still the
    keep's), or a new one for its name, made by `made_by`, when it had none (podguard made the copy)."""
    env = dict(env)
    return env if mark_of(env) is not None else with_mark(env, Mark(name_hash(name), made_by, "", gpus))


def marked_spec(spec: PodSpec, *, keep: str) -> PodSpec:
    """The spec whose pods (cluster nodes) carry the mark of its name, made by the keep `keep`."""
    gpus = spec.gpu.count if spec.gpu is not None else None
    mark = Mark(name_hash(spec.name), keep, spec_hash(spec), gpus)
    return replace(spec, env=with_mark(spec.env, mark))


def stranger_line(pod: object) -> str:
    """`pod abc123 (image registry/x:1, RUNNING)`: a pod of the name that is not podguard's, as a refusal names it."""
    pod_id = getattr(pod, "id", "?")
    image = getattr(pod, "image", "") or "?"
    status = getattr(pod, "status", "?")
    return f"pod {pod_id} (image {image}, {status})"

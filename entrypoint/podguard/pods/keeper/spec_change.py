"""What changed in the spec since a pod (cluster) was made from it, in words (pure, no I/O).

    spec_changes(pod, spec, nodes=None)    # ["GPU count 2 -> 4", "image a:1 -> a:2"], [] when it is the same spec

The mark's spec hash tells that the spec changed; the pod itself (and the GPU count in its mark) tells what. Env
values are never shown (they may be secrets): only the names of variables that were added, removed or changed. A
change is applied at the next replacement (a start keeps the pod as it is), and it is never a host fault: fewer GPUs
than the edited spec asks is not fewer than the pod was made with.
"""

from __future__ import annotations

from podguard.pods.mark import ENV_MARK, mark_of, spec_hash
from podguard.pods.pod import Pod
from podguard.pods.spec import PodSpec

__all__ = ["spec_changes"]


def _env_names(pod_env: dict[str, str], spec_env: dict[str, str]) -> str:
    theirs = {k: v for k, v in pod_env.items() if k != ENV_MARK}
    ours = {k: v for k, v in spec_env.items() if k != ENV_MARK}
    names = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    return ", ".join(names)


def spec_changes(pod: Pod | None, spec: PodSpec, nodes: int | None) -> list[str]:
    """The differences between the spec and `pod` (a cluster: one member, and its node count), [] when its mark
    says it was made from this very spec, or it has no mark (nothing to compare against)."""
    if pod is None:
        return []
    mark = mark_of(pod.env)
    if mark is None or not mark.spec or mark.spec == spec_hash(spec):
        return []
    out: list[str] = []
    want = spec.gpu.count if spec.gpu is not None else None
    if mark.gpus is not None and want is not None and mark.gpus != want:
        out.append(f"GPU count {mark.gpus} -> {want}")
    if pod.gpu is not None and spec.gpu_types and pod.gpu.type not in spec.gpu_types:
        out.append(f"GPU type {pod.gpu.type} -> {' or '.join(spec.gpu_types)}")
    if spec.cluster is not None and nodes is not None and nodes != spec.cluster.nodes:
        out.append(f"nodes {nodes} -> {spec.cluster.nodes}")
    if pod.image and pod.image != spec.image:
        out.append(f"image {pod.image} -> {spec.image}")
    if pod.args != spec.args:
        out.append(f"args {pod.args!r} -> {spec.args!r}")
    if pod.disk_gb is not None and pod.disk_gb != spec.disk_gb:
        out.append(f"disk {pod.disk_gb} GB -> {spec.disk_gb} GB")
    if pod.port_specs and tuple(pod.port_specs) != tuple(spec.ports):
        out.append(f"ports {', '.join(pod.port_specs)} -> {', '.join(spec.ports)}")
    env = _env_names(pod.env, spec.env)
    if env:
        out.append(f"env {env}")
    return out or ["the spec (its hash; nothing the pod shows)"]

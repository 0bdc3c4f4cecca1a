"""A pod's metrics URL through RunPod's HTTP proxy, for `pod up` and `pod status` (pods/render.py).

    metrics_url(pod)   # "https://abc123-9464.proxy.runpod.net/metrics", or None

The URL exists when the pod runs podguard with a metrics port (`[env] PODGUARD_METRICS_PORT`, or `--metrics-port`
in its args) and exposes that port over HTTP (`ports = ["9464/http"]`). RunPod forms the proxy address as
`https://{POD_ID}-{INTERNAL_PORT}.proxy.runpod.net` (runpod/docs, pods/configuration/expose-ports.mdx).
Standard library only: the laptop side imports it without prometheus_client. It lives in pods/ (not metrics/,
which imports pods/ for this pod's price): the laptop's renderer is its only user.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from typing import Protocol

__all__ = ["metrics_port_of", "metrics_url", "proxy_url"]

ENV_PORT = "PODGUARD_METRICS_PORT"


class _PodLike(Protocol):
    id: str
    env: dict[str, str]
    args: str
    port_specs: tuple[str, ...]


def proxy_url(pod_id: str, port: int, path: str = "/metrics") -> str:
    return f"https://{pod_id}-{port}.proxy.runpod.net{path}"


def metrics_port_of(env: Mapping[str, str], args: str) -> int | None:
    """The metrics port podguard will serve in the pod: `--metrics-port` in its args wins over the env."""
    try:
        words = shlex.split(args or "")
    except ValueError:
        words = []
    raw = env.get(ENV_PORT)
    for i, word in enumerate(words):
        if word == "--":
            break  # the job's own arguments
        if word == "--metrics-port" and i + 1 < len(words):
            raw = words[i + 1]
        elif word.startswith("--metrics-port="):
            raw = word.partition("=")[2]
    text = (raw or "").strip()
    return int(text) if text.isdigit() and 1 <= int(text) <= 65535 else None


def _http_ports(specs: Iterable[str]) -> set[int]:
    ports = set()
    for spec in specs:
        number, _, kind = str(spec).strip().partition("/")
        if kind.lower() == "http" and number.isdigit():
            ports.add(int(number))
    return ports


def metrics_url(pod: _PodLike) -> str | None:
    """The proxy URL of the pod's metrics, or None when it serves none or does not expose the port over HTTP."""
    port = metrics_port_of(pod.env or {}, pod.args or "")
    if port is None or not pod.id or port not in _http_ports(pod.port_specs):
        return None
    return proxy_url(pod.id, port)

"""Where this node's torchrun agent meets the others, and the agent arguments that say so.

    rdzv = resolve_rendezvous(os.environ)                       # flags, then NUM_NODES / NODE_RANK / PRIMARY_*
    rendezvous_args(rdzv, RdzvBackend.AUTO)                     # ["--nnodes", "2", "--rdzv-backend", "static", ...]

With NODE_RANK known, multi-node jobs use torch's static rendezvous, so node n holds global ranks
n*k .. n*k+k-1 and the NODE_RANK=0 node has rank 0; c10d (elastic) numbers nodes by sorting their
addresses instead. The facts behind every choice: docs/torchrun.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from podguard.errors import UsageError
from podguard.launch.ports import parse_int, parse_port

__all__ = [
    "DEFAULT_MULTINODE_PORT",
    "DEFAULT_RDZV_ID",
    "RdzvBackend",
    "Rendezvous",
    "host_node_addr",
    "rendezvous_args",
    "resolve_rendezvous",
]

DEFAULT_MULTINODE_PORT = 29500  # torch's default; every node computes the same value
DEFAULT_RDZV_ID = "podguard"  # must be identical on every node, so it cannot be random
_RDZV_ID = re.compile(r"[A-Za-z0-9._-]+")


class RdzvBackend(StrEnum):
    AUTO = "auto"  # static when every node knows its NODE_RANK (rank order = node order), else c10d
    STATIC = "static"  # --node-rank decides the ranks; no elasticity
    C10D = "c10d"  # torch's elastic rendezvous; node ranks by sorted address


def env_value(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value if value not in (None, "") else None


@dataclass(frozen=True)
class Rendezvous:
    """The resolved multi-node settings of this node."""

    nnodes: int
    node_rank: int | None  # None when unknown (single node, or c10d decides)
    addr: str | None  # rendezvous host; None = standalone
    port: int | None
    local_addr: str | None  # this node's address on the cluster network (RunPod NODE_ADDR)
    rdzv_id: str


def _nnodes(environ: Mapping[str, str], nnodes: int | str | None) -> tuple[int, str]:
    raw = nnodes if nnodes is not None else env_value(environ, "NUM_NODES")
    name = "--nnodes" if nnodes is not None else "NUM_NODES"
    if raw is None:
        return 1, name
    n = parse_int(raw, name, "expected the number of nodes, an integer >= 1")
    if n < 1:
        raise UsageError(f"{name}={n} is invalid; expected the number of nodes, an integer >= 1")
    return n, name


def _node_rank(environ: Mapping[str, str], node_rank: int | str | None, n: int) -> int | None:
    raw = node_rank if node_rank is not None else env_value(environ, "NODE_RANK")
    name = "--node-rank" if node_rank is not None else "NODE_RANK"
    if raw is None:
        return None
    rank = parse_int(raw, name, f"expected this node's rank in [0, {n})")
    if not 0 <= rank < n:
        raise UsageError(
            f"{name}={rank} is out of range; expected this node's rank in [0, {n}) for {n} node{'s' if n != 1 else ''}"
        )
    return rank


def host_node_addr(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """RunPod's HOST_NODE_ADDR (`PRIMARY_ADDR:PRIMARY_PORT`, `[v6]:port` for IPv6) as (host, port); None if unset."""
    raw = env_value(environ, "HOST_NODE_ADDR")
    if raw is None:
        return None
    host, sep, port = raw.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port:
        raise UsageError(f"HOST_NODE_ADDR={raw!r} is not valid; expected HOST:PORT, e.g. 10.65.0.1:29500")
    return host, parse_port(port, "HOST_NODE_ADDR's port")


def _port(environ: Mapping[str, str], master_port: int | str | None, n: int) -> int | None:
    if master_port is not None:
        return parse_port(master_port, "--master-port")
    if n == 1:
        return None
    for var in ("PRIMARY_PORT", "MASTER_PORT"):
        raw = env_value(environ, var)
        if raw is not None:
            return parse_port(raw, var)
    host_node = host_node_addr(environ)
    return host_node[1] if host_node is not None else DEFAULT_MULTINODE_PORT


def resolve_rendezvous(
    environ: Mapping[str, str],
    *,
    nnodes: int | str | None = None,
    node_rank: int | str | None = None,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    rdzv_id: str | None = None,
) -> Rendezvous:
    """Node count, node rank and the primary's address/port: flags first, then RunPod's Instant Cluster
    variables (PRIMARY_ADDR / PRIMARY_PORT / NODE_RANK / NUM_NODES / NODE_ADDR), then MASTER_*, then
    HOST_NODE_ADDR (PRIMARY_ADDR:PRIMARY_PORT).
    Bad values raise UsageError (exit 64) naming the value and what is valid."""
    n, name_nnodes = _nnodes(environ, nnodes)
    rank = _node_rank(environ, node_rank, n)
    port = _port(environ, master_port, n)
    addr = master_addr or None
    local_addr = None
    if n > 1:
        addr = addr or env_value(environ, "PRIMARY_ADDR") or env_value(environ, "MASTER_ADDR")
        if addr is None:
            host_node = host_node_addr(environ)
            addr = host_node[0] if host_node is not None else None
        if addr is None:
            raise UsageError(
                f"{name_nnodes}={n} needs the primary node's address: set PRIMARY_ADDR "
                "(RunPod Instant Clusters set it), MASTER_ADDR or HOST_NODE_ADDR, or pass --master-addr"
            )
        local_addr = env_value(environ, "NODE_ADDR")
    elif port is not None:
        addr = addr or "127.0.0.1"
    if rdzv_id is not None and not _RDZV_ID.fullmatch(rdzv_id):
        raise UsageError(f"--rdzv-id={rdzv_id!r} is invalid; use letters, digits, '.', '_' or '-'")
    return Rendezvous(n, rank, addr, port, local_addr, rdzv_id or DEFAULT_RDZV_ID)


def _host_for_endpoint(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def pick_backend(rdzv: Rendezvous, backend: RdzvBackend | str) -> RdzvBackend:
    try:
        chosen = RdzvBackend(backend)
    except ValueError:
        raise UsageError(
            f"rendezvous backend {backend!r} is not supported; expected one of: {', '.join(RdzvBackend)}"
        ) from None
    if chosen is RdzvBackend.AUTO:
        return RdzvBackend.STATIC if rdzv.node_rank is not None else RdzvBackend.C10D
    return chosen


def rendezvous_args(rdzv: Rendezvous, backend: RdzvBackend | str) -> list[str]:
    """torchrun's rendezvous options for this node (see docs/torchrun.md for each choice)."""
    chosen = pick_backend(rdzv, backend)
    if rdzv.nnodes == 1:
        if rdzv.port is None:
            return ["--standalone"]
        assert rdzv.addr is not None
        # static, not c10d: with c10d torch hands the workers a *different*, ephemeral MASTER_PORT
        return ["--nnodes", "1", "--rdzv-backend", "static", "--node-rank", "0", *_master(rdzv)]
    assert rdzv.addr is not None and rdzv.port is not None
    local = ["--local-addr", rdzv.local_addr] if rdzv.local_addr else []
    if chosen is RdzvBackend.STATIC:
        if rdzv.node_rank is None:
            raise UsageError(
                f"static rendezvous over {rdzv.nnodes} nodes needs NODE_RANK (or --node-rank) "
                f"in [0, {rdzv.nnodes}) on every node"
            )
        args = ["--nnodes", str(rdzv.nnodes), "--rdzv-backend", "static", "--node-rank", str(rdzv.node_rank)]
        return [*args, *_master(rdzv), *local]
    args = ["--nnodes", str(rdzv.nnodes), "--rdzv-backend", "c10d"]
    args += ["--rdzv-endpoint", f"{_host_for_endpoint(rdzv.addr)}:{rdzv.port}", "--rdzv-id", rdzv.rdzv_id]
    if rdzv.node_rank is not None:  # torch's own guess misses secondary NICs: say which node hosts the store
        args += ["--rdzv-conf", f"is_host={'true' if rdzv.node_rank == 0 else 'false'}"]
    return [*args, *local]


def _master(rdzv: Rendezvous) -> list[str]:
    assert rdzv.addr is not None and rdzv.port is not None
    return ["--master-addr", rdzv.addr, "--master-port", str(rdzv.port)]

"""Loopback helpers shared by the tests and benches that run real nodes, ranks or servers on this host.

port = free_port()                     # one free TCP port on 127.0.0.1
port = free_port_pair()                # PRIMARY_PORT: it and the cluster gate's PRIMARY_PORT + 1 are free
env = cluster_node_env(tmp_path, 1, port, NODE_ADDR="127.0.0.1")   # a CPU node of a 2-node cluster
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

# What a developer's shell or an outer podguard run may have set, and a node of these tests must not inherit.
_NOT_INHERITED = (
    "GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_ADDR",
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HOST_NODE_ADDR", "RUNPOD_GPU_COUNT",
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port whose successor is free too (the cluster gate's default port is PRIMARY_PORT + 1)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports")


def cluster_node_env(tmp_path: Path, node_rank: int, port: int, **extra: str) -> dict[str, str]:
    """RunPod's Instant Cluster variables for node `node_rank` of 2 over loopback, as a CPU node (gloo)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PODGUARD_", "MASTER_", "TORCHELASTIC_"))}
    for var in _NOT_INHERITED:
        env.pop(var, None)
    env.update(
        LD_LIBRARY_PATH="",  # no NVIDIA driver: a CPU node
        PODGUARD_PROBE="off",
        PODGUARD_STATE_DIR=str(tmp_path / f"node{node_rank}"),  # separate machines do not share a state dir
        NUM_NODES="2",
        NODE_RANK=str(node_rank),
        PRIMARY_ADDR="127.0.0.1",
        PRIMARY_PORT=str(port),
        NUM_TRAINERS="2",
        OMP_NUM_THREADS="1",
        **extra,
    )
    return env

"""Where the preflight meets the cluster gate (multi-node runs): the gate's settings, this node's verdict,
and the workers' socket interface. preflight/ and launch/ never import each other; this glue does.

    settings = cluster_gate_settings(cfg, port=None, timeout_s=600.0)   # None on one node; 64 for bad values
    outcome = pass_cluster_gate(settings, pre, notes) # after the preflight: every node's verdict, then the decision
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.errors import UsageError
from podguard.launch.config import JobConfig
from podguard.launch.multinode.netif import socket_ifname_env
from podguard.launch.multinode.verdicts import NodeVerdict, gate_settings
from podguard.preflight.report import verdict_word
from podguard.state import subdir, write_private

if TYPE_CHECKING:
    from podguard.launch.multinode.verdicts import GateOutcome, GateSettings
    from podguard.preflight.pipeline import PreflightResult

__all__ = ["GATE_RECORD", "cluster_gate_settings", "pass_cluster_gate", "worker_socket_env"]

GATE_RECORD = "cluster-gate.json"  # in <state>/reports: the last gate's outcome, with wall-clock times


def cluster_gate_settings(cfg: JobConfig, *, port: int | None, timeout_s: float) -> GateSettings | None:
    """The gate's settings on a multi-node run (`port`: PODGUARD_CLUSTER_PORT, None: PRIMARY_PORT + 1; `timeout_s`:
    how long it waits for every node) (None on one node, or without NODE_RANK: then said once).
    Bad values and a Python without torch are refused here (64), before anything is leased or stopped. During
    the run the nodes also share their progress on the gate's store (launch/multinode/share.py); without NODE_RANK
    each node judges a hang on its own."""
    if not cfg.multi_node:
        return None
    from podguard.launch.torchrun.rendezvous import resolve_rendezvous  # noqa: PLC0415  lazy: multi-node only (`podguard run` loads no torchrun module)

    opts = cfg.options
    rdzv = resolve_rendezvous(
        os.environ, nnodes=opts.nnodes, node_rank=opts.node_rank, master_addr=opts.master_addr,
        master_port=opts.master_port,
    )  # fmt: skip
    if rdzv.node_rank is None:
        console.warn("no NODE_RANK, so no cluster gate: the nodes cannot tell which one hosts it")
        return None
    assert rdzv.addr is not None and rdzv.port is not None
    settings = gate_settings(
        nnodes=rdzv.nnodes,
        node_rank=rdzv.node_rank,
        addr=rdzv.addr,
        rdzv_port=rdzv.port,
        cluster_port=port,
        timeout_s=timeout_s,
    )
    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            f"a multi-node run gates the cluster through torch's TCPStore, but {sys.executable} has no torch; "
            "install it there (pip install torch)"
        )
    return settings


def pass_cluster_gate(settings: GateSettings, pre: PreflightResult, notes: list[str], state: Path) -> GateOutcome:
    """Publish this node's preflight verdict and follow the cluster's decision (the summary is printed);
    the outcome is also written to `<state>/reports/cluster-gate.json` (best effort)."""
    from podguard.launch.multinode.gate import run_cluster_gate  # noqa: PLC0415  lazy: multi-node only (the gate and its TCPStore protocol)

    verdict = NodeVerdict(
        rank=settings.node_rank,
        word=verdict_word(pre.exit_code),
        code=pre.exit_code,
        reasons=pre.reasons,
        host=socket.gethostname(),
    )
    outcome = run_cluster_gate(settings, verdict, notes=notes)
    _record(state, {**outcome.to_data(), "returned_at": time.time(), "endpoint": settings.endpoint})
    return outcome


def _record(state: Path, data: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        write_private(subdir(state, "reports") / GATE_RECORD, json.dumps(data, indent=2))


def worker_socket_env() -> tuple[dict[str, str], list[str]]:
    """NCCL/GLOO_SOCKET_IFNAME from NODE_ADDR (nothing when NODE_ADDR is unset) and the summary line."""
    if not os.environ.get("NODE_ADDR"):
        return {}, []
    env, note = socket_ifname_env(os.environ)
    return env, [note] if note else []

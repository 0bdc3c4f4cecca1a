"""The progress share of a multi-node run (launch/cluster/share.py, issue 23 item 1), two nodes in one process
on loopback: node 0 hosts the store on the gate's port, node 1 joins; a node hears the other's progress, and
never its own echo (silence on every node stays silence)."""

from __future__ import annotations

import importlib.util
import time

import pytest

from loopback import free_port
from podguard.launch.cluster.model import gate_settings
from podguard.launch.cluster.share import ProgressShare

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def _wait(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_each_node_hears_the_others_progress_and_never_its_own_echo():
    port = free_port()
    counts = {0: 0, 1: 0}
    shares = [
        ProgressShare(
            gate_settings(nnodes=2, node_rank=rank, addr="127.0.0.1", rdzv_port=port - 1, cluster_port=port,
                          timeout_s=30),
            lambda rank=rank: counts[rank],
            interval_s=0.1,
        )
        for rank in (1, 0)  # node 1 first: it waits for node 0's store
    ]  # fmt: skip
    node1, node0 = shares
    try:
        for share in shares:
            share.start()
        assert _wait(lambda: node0.connected and node1.connected)
        time.sleep(0.5)
        assert node0.remote() is None and node1.remote() is None  # nobody moved: silence on both
        before = time.monotonic()
        counts[0] += 3  # node 0's workers printed
        assert _wait(lambda: node1.remote() is not None)
        at, what = node1.remote()
        assert at >= before and what == "progress on node 0"
        time.sleep(0.5)
        assert node0.remote() is None  # node 1 heard it, but never sends it back
        counts[1] += 1
        assert _wait(lambda: node0.remote() is not None) and node0.remote()[1] == "progress on node 1"
    finally:
        for share in shares:
            share.close()

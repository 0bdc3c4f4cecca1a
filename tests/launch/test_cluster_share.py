"""The progress share of a multi-node run (launch/multinode/share.py, issue 23 item 1), two nodes in one process
on loopback: node 0 hosts the store on the gate's port, node 1 joins; a node hears the other's progress, and
never its own echo (silence on every node stays silence)."""

from __future__ import annotations

import importlib.util
import time

import pytest

from loopback import free_port
from podguard import console
from podguard.launch.multinode.share import ProgressShare
from podguard.launch.multinode.verdicts import gate_settings

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


def test_node_1_hears_a_restarted_node_0_whose_counters_start_again():
    """Node 0's podguard restarts (a replaced pod, torchrun's --max-restarts brings the ranks back): its new store
    counts from 0. Node 1 forgot the old counts (it compared with them: a false hang until the new count passed the
    old one, hours on a long run)."""
    port = free_port()

    def node(rank: int, count) -> ProgressShare:
        settings = gate_settings(nnodes=2, node_rank=rank, addr="127.0.0.1", rdzv_port=port - 1, cluster_port=port,
                                 timeout_s=30)  # fmt: skip
        return ProgressShare(settings, count, interval_s=0.1)

    first, second = [500], [0]
    node1, node0 = node(1, lambda: 0), node(0, lambda: first[0])
    node1.start()
    node0.start()
    try:
        assert _wait(lambda: node1.remote() is not None)  # node 0's 500 events so far
        node0.close()
        assert not node0._thread.is_alive()
        restarted = node(0, lambda: second[0])
        node0 = restarted
        restarted.start()
        assert _wait(lambda: restarted.connected)
        time.sleep(0.5)
        before = time.monotonic()
        second[0] = 5  # the restarted node's ranks moved again
        assert _wait(lambda: node1.remote()[0] >= before, timeout=10.0)
    finally:
        node1.close()
        node0.close()


def test_node_0_whose_port_is_taken_says_so_once_and_keeps_trying(monkeypatch: pytest.MonkeyPatch):
    import socket

    import podguard.launch.multinode.share as share_module

    monkeypatch.setattr(share_module, "SAY_AFTER_S", 0.3)
    with console.captured() as said, socket.socket() as squatter:  # (the thread's warning: a podguard line)
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("0.0.0.0", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        settings = gate_settings(nnodes=2, node_rank=0, addr="127.0.0.1", rdzv_port=port - 1, cluster_port=port,
                                 timeout_s=30)  # fmt: skip
        node0 = ProgressShare(settings, lambda: 0, interval_s=0.1)
        node0.start()
        try:
            assert _wait(lambda: bool(said), timeout=10.0)
            time.sleep(0.5)
        finally:
            node0.close()
    assert len(said) == 1 and not node0.connected
    assert f"cannot host the progress share on 127.0.0.1:{port}" in said[0] and "own workers' output" in said[0]

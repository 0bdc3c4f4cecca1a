"""The cluster gate for real: `podguard train` processes on this host as the nodes of one cluster.

RunPod's Instant Cluster variables (NUM_NODES, NODE_RANK, PRIMARY_ADDR, PRIMARY_PORT, NODE_ADDR) over
loopback; node 0 hosts torch's TCPStore. A CPU node passes its preflight; a node on the suite's fake
libnvidia-ml.so.1 with uncorrected ECC on its GPU fails it. Every job writes a marker file, so "no worker
started anywhere" is checked on disk, not only in the output.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenvml import scenario as sc
from loopback import cluster_node_env, free_port_pair

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

PODGUARD = [sys.executable, "-m", "podguard"]

JOB = """
import os, pathlib, sys
marker = pathlib.Path(sys.argv[1]) / f"rank{os.environ['RANK']}"
marker.write_text(" ".join(os.environ.get(v, "-") for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "GROUP_RANK")))
print("worker", os.environ["RANK"], "started", flush=True)
"""


def _sick_env(nvml_node, tmp_path: Path, node_rank: int, port: int) -> dict[str, str]:
    """A node whose only selected GPU has uncorrected ECC errors: its own preflight says UNHEALTHY (76)."""
    nvml_node.write(sc.ecc_and_remap(ecc_gpu=1, remap_gpu=2))
    env = cluster_node_env(tmp_path, node_rank, port, GPU_LIST="1")
    fake = nvml_node.env
    for var in ("LD_LIBRARY_PATH", "FAKE_NVML_SCENARIO", "FAKE_NVML_PROCS_DIR", "PODGUARD_DEV_DIR"):
        env[var] = fake[var]
    return env


def _start(tmp_path: Path, env: dict[str, str], *args: str, mode: str = "torchrun") -> subprocess.Popen[str]:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return subprocess.Popen(
        [*PODGUARD, "train", "--mode", mode, "--grace", "3", *args, "--", sys.executable, str(job), str(markers)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str, float]:
    """(exit code, output, monotonic time it was seen to end)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, time.monotonic()


def _markers(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "markers"
    return {p.name: p.read_text() for p in folder.iterdir()} if folder.exists() else {}


def test_all_healthy_nodes_launch_every_rank_and_workers_use_the_interface_holding_node_addr(tmp_path: Path):
    port = free_port_pair()
    node1 = _start(tmp_path, cluster_node_env(tmp_path, 1, port, NODE_ADDR="127.0.0.1"), mode="auto")  # first: it waits
    node0 = _start(tmp_path, cluster_node_env(tmp_path, 0, port, NODE_ADDR="127.0.0.1"), mode="auto")
    code0, out0, _ = _finish(node0)
    code1, out1, _ = _finish(node1)
    assert code0 == 0, out0[-3000:]
    assert code1 == 0, out1[-3000:]
    for out, rank in ((out0, 0), (out1, 1)):
        assert f"podguard cluster gate: PASS: all 2 nodes passed their preflight (node {rank} of 2" in out
        assert "socket interface: lo (holds NODE_ADDR=127.0.0.1)" in out
        assert "mode auto -> torchrun: 2 nodes" in out  # auto on several nodes is torchrun, even on CPU
    # the job ran on all four ranks, node 0 holding ranks 0 and 1; every worker sees lo as its socket interface
    assert _markers(tmp_path) == {"rank0": "lo lo 0", "rank1": "lo lo 0", "rank2": "lo lo 1", "rank3": "lo lo 1"}


def test_an_unhealthy_node_stops_the_whole_cluster_within_seconds_and_no_worker_starts(
    tmp_path: Path, nvml_node
):  # fmt: skip
    port = free_port_pair()
    node0 = _start(tmp_path, cluster_node_env(tmp_path, 0, port))
    node1 = _start(tmp_path, _sick_env(nvml_node, tmp_path, 1, port))
    code1, out1, ended1 = _finish(node1)
    code0, out0, ended0 = _finish(node0)
    assert code1 == 76, out1[-3000:]  # its own preflight's code
    assert "UNHEALTHY" in out1 and "this node failed its preflight" in out1
    assert code0 == 76, out0[-3000:]  # the healthy node does not launch either
    assert "podguard train: PASS" in out0  # its own preflight passed ...
    assert "podguard cluster gate: FAIL (node 0 of 2): node(s) 1 failed; no node launches" in out0  # ... the gate not
    reason = next(line for line in out0.splitlines() if "node 1: UNHEALTHY GPU 1:" in line)
    assert "ECC" in reason, out0
    assert ended0 - ended1 < 5.0  # node 0 heard it within seconds (the gate itself takes milliseconds)
    assert _markers(tmp_path) == {}  # no worker started anywhere
    assert "worker" not in out0 + out1


def test_node_0_failing_still_tells_a_node_that_starts_after_it_decided(tmp_path: Path, nvml_node):
    port = free_port_pair()
    node0 = _start(tmp_path, _sick_env(nvml_node, tmp_path, 0, port))
    state = tmp_path / "node0" / "reports"
    deadline = time.monotonic() + 60
    while not state.exists() and time.monotonic() < deadline:  # node 0's preflight has failed and it hosts
        time.sleep(0.05)
    node1 = _start(tmp_path, cluster_node_env(tmp_path, 1, port))
    code1, out1, _ = _finish(node1)
    code0, out0, _ = _finish(node0)
    assert code0 == 76, out0[-3000:]
    assert code1 == 76, out1[-3000:]
    assert "node 0: UNHEALTHY GPU 1:" in out1  # node 0 stayed up long enough for node 1 to read its verdict
    assert _markers(tmp_path) == {}


def test_a_node_that_never_starts_makes_the_others_exit_75_after_the_cluster_timeout(tmp_path: Path):
    port = free_port_pair()
    started = time.monotonic()
    node0 = _start(tmp_path, cluster_node_env(tmp_path, 0, port), "--cluster-timeout", "3")
    code0, out0, ended = _finish(node0)
    assert code0 == 75, out0[-3000:]
    assert "node(s) 1 did not report within 3 s (--cluster-timeout)" in out0
    assert 3.0 <= ended - started < 60
    assert _markers(tmp_path) == {}


def test_sigterm_while_waiting_for_the_other_nodes_exits_promptly_with_143(tmp_path: Path):
    port = free_port_pair()
    node1 = _start(tmp_path, cluster_node_env(tmp_path, 1, port))  # node 0 never comes: node 1 waits for it
    out = ""
    deadline = time.monotonic() + 60
    report = tmp_path / "node1" / "reports" / "latest.json"
    while not report.exists() and time.monotonic() < deadline:  # its preflight is done: it is in the gate
        time.sleep(0.05)
    time.sleep(0.5)  # well under a second: let it enter the wait proper (nothing to poll for)
    sent = time.monotonic()
    node1.send_signal(signal.SIGTERM)
    code, out, ended = _finish(node1, timeout=30)
    assert code == 128 + signal.SIGTERM, out[-3000:]
    assert ended - sent < 5.0, ended - sent  # typically well under a second
    assert "received SIGTERM while waiting for the other nodes" in out


def test_a_cluster_port_in_use_on_node_0_is_64_naming_the_variable(tmp_path: Path):
    port = free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", port + 1))
        squatter.listen()
        node0 = _start(tmp_path, cluster_node_env(tmp_path, 0, port))
        code, out, _ = _finish(node0, timeout=60)
    assert code == 64, out[-3000:]
    assert f"port {port + 1} is in use on node 0; set PODGUARD_CLUSTER_PORT" in out
    assert "Traceback" not in out


def _connections_to(port: int) -> int:
    """Established TCP connections whose remote end is `port` on this host (/proc/net/tcp and tcp6)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:  # 01: ESTABLISHED
                    count += 1
    return count


def test_a_stale_store_of_an_earlier_attempt_is_not_followed_and_the_next_one_is(tmp_path: Path):
    import datetime

    from podguard.launch.multinode.protocol import ROOT, SESSION_KEY, load_store_class

    store_class = load_store_class()  # torch's TCPStore, imported quietly
    port = free_port_pair()
    # what an earlier attempt's node 0 left while it lingered: its session and a launch decision
    ten_s = datetime.timedelta(seconds=10)
    stale = store_class("127.0.0.1", port + 1, None, True, timeout=ten_s, wait_for_workers=False)
    stale.set(SESSION_KEY, "earlier")
    stale.set(f"{ROOT}/earlier/decision", '{"code": 0, "failed": [], "missing": []}')
    baseline = _connections_to(port + 1)  # the store's own client
    node1 = _start(tmp_path, cluster_node_env(tmp_path, 1, port))
    deadline = time.monotonic() + 60
    while _connections_to(port + 1) <= baseline and time.monotonic() < deadline:  # node 1 reached the stale store
        time.sleep(0.05)
    time.sleep(0.3)  # well under a second: node 1 reads the stale decision (milliseconds)
    del stale  # node 0 of that attempt is gone; the next attempt's node 0 starts
    node0 = _start(tmp_path, cluster_node_env(tmp_path, 0, port))
    code0, out0, _ = _finish(node0)
    code1, out1, _ = _finish(node1)
    assert code1 == 0, out1[-3000:]
    assert code0 == 0, out0[-3000:]
    assert "node 0's store still holds an earlier attempt; waited for a new one" in out1
    assert sorted(_markers(tmp_path)) == ["rank0", "rank1", "rank2", "rank3"]

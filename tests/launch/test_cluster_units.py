"""The cluster gate's parts that need no second node: the interface that holds NODE_ADDR, the gate's
settings and options (bad values are 64 naming them), HOST_NODE_ADDR, the summary, and the lazy torch import."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from podguard.errors import ExitCode, UsageError
from podguard.launch.multinode.netif import _ipv6_owner, interface_holding, socket_ifname_env
from podguard.launch.multinode.verdicts import GateOutcome, NodeVerdict, format_gate_summary, gate_settings
from podguard.launch.torchrun.rendezvous import resolve_rendezvous

PODGUARD = [sys.executable, "-m", "podguard"]


# -------------------------------------------------------------------------------- the socket interface


def test_the_interface_holding_an_address_is_found_through_the_kernel():
    assert interface_holding("127.0.0.1") == "lo"
    assert interface_holding("192.0.2.254") is None  # TEST-NET-1: nobody here holds it
    assert interface_holding("not-an-address") is None
    names = {name for _, name in socket.if_nameindex()}
    assert "lo" in names


def test_ipv6_addresses_are_read_from_proc_net_if_inet6(tmp_path: Path):
    table = tmp_path / "if_inet6"
    table.write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\nfd000000000000000000000000000002 05 40 00 80     ens1\n"
    )
    import ipaddress

    assert _ipv6_owner(ipaddress.IPv6Address("fd00::2"), table) == "ens1"
    assert _ipv6_owner(ipaddress.IPv6Address("::1"), table) == "lo"
    assert _ipv6_owner(ipaddress.IPv6Address("fd00::3"), table) is None
    assert _ipv6_owner(ipaddress.IPv6Address("fd00::2"), tmp_path / "absent") is None


def test_workers_get_the_interface_of_node_addr_unless_the_user_chose_one():
    env, note = socket_ifname_env({"NODE_ADDR": "127.0.0.1"})
    assert env == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    assert note is not None and "lo (holds NODE_ADDR=127.0.0.1)" in note
    both = {"NODE_ADDR": "127.0.0.1", "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib1"}
    kept, note = socket_ifname_env(both)
    assert kept == {} and note == "socket interface: NCCL_SOCKET_IFNAME=ib0, GLOO_SOCKET_IFNAME=ib1 (yours, kept)"
    assert socket_ifname_env({}) == ({}, None)
    none, warning = socket_ifname_env({"NODE_ADDR": "192.0.2.254"})
    assert none == {} and warning is not None and "no interface here holds NODE_ADDR=192.0.2.254" in warning


@pytest.mark.parametrize(
    ("yours", "pinned"),
    [("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"), ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")],
)
def test_each_socket_variable_is_decided_on_its_own(yours, pinned):
    """RunPod's docs say `export NCCL_SOCKET_IFNAME=ens1`: gloo must still get the interface holding NODE_ADDR
    (else it may take the eth0 NAT), and the other way round."""
    env, note = socket_ifname_env({"NODE_ADDR": "127.0.0.1", yours: "ens1"})
    assert env == {pinned: "lo"}
    assert note == f"socket interface: lo (holds NODE_ADDR=127.0.0.1) -> {pinned}; {yours}=ens1 (yours, kept)"
    lost, warning = socket_ifname_env({"NODE_ADDR": "192.0.2.254", yours: "ens1"})
    assert lost == {} and warning is not None and f"{pinned} left unset" in warning and f"{yours}=ens1" in warning


def test_a_workers_environment_has_gloo_pinned_when_the_user_exported_only_nccl(tmp_path):
    """A real `podguard run` on this (GPU-less) host: the job sees the user's NCCL value and gloo on `lo`."""
    job = "import os; print('IFNAMES', os.environ.get('NCCL_SOCKET_IFNAME'), os.environ.get('GLOO_SOCKET_IFNAME'))"
    drop = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NUM_NODES", "NODE_RANK", "RUNPOD_POD_ID", "LD_LIBRARY_PATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(NODE_ADDR="127.0.0.1", NCCL_SOCKET_IFNAME="ens1", PODGUARD_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.run(
        [*PODGUARD, "run", "--", sys.executable, "-c", job], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "IFNAMES ens1 lo" in proc.stdout
    assert "NCCL_SOCKET_IFNAME=ens1 (yours, kept)" in proc.stdout + proc.stderr


# -------------------------------------------------------------------------------- settings and variables


def test_the_gate_port_defaults_to_primary_port_plus_one_and_bad_ports_are_64():
    s = gate_settings(nnodes=2, node_rank=1, addr="10.65.0.1", rdzv_port=29500, cluster_port=None, timeout_s=600)
    assert (s.port, s.hosts, s.endpoint) == (29501, False, "10.65.0.1:29501")
    assert gate_settings(nnodes=2, node_rank=0, addr="::1", rdzv_port=1, cluster_port=4000, timeout_s=1).port == 4000
    with pytest.raises(UsageError, match=r"PRIMARY_PORT \+ 1 = 65536.*PODGUARD_CLUSTER_PORT"):
        gate_settings(nnodes=2, node_rank=0, addr="a", rdzv_port=65535, cluster_port=None, timeout_s=1)
    with pytest.raises(UsageError, match="PODGUARD_CLUSTER_PORT=29500 is the rendezvous port"):
        gate_settings(nnodes=2, node_rank=0, addr="a", rdzv_port=29500, cluster_port=29500, timeout_s=1)


def test_host_node_addr_is_honoured_when_primary_and_master_are_unset():
    rdzv = resolve_rendezvous({"NUM_NODES": "2", "NODE_RANK": "1", "HOST_NODE_ADDR": "10.65.0.1:29400"})
    assert (rdzv.addr, rdzv.port) == ("10.65.0.1", 29400)
    v6 = resolve_rendezvous({"NUM_NODES": "2", "NODE_RANK": "0", "HOST_NODE_ADDR": "[fd00::1]:29400"})
    assert (v6.addr, v6.port) == ("fd00::1", 29400)
    both = {"NUM_NODES": "2", "PRIMARY_ADDR": "10.65.0.9", "PRIMARY_PORT": "1234", "HOST_NODE_ADDR": "10.65.0.1:29400"}
    assert (resolve_rendezvous(both).addr, resolve_rendezvous(both).port) == ("10.65.0.9", 1234)
    with pytest.raises(UsageError, match=re.escape("HOST_NODE_ADDR='10.65.0.1' is not valid")):
        resolve_rendezvous({"NUM_NODES": "2", "HOST_NODE_ADDR": "10.65.0.1"})


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--cluster-timeout", "0"], {}, "--cluster-timeout=0"),
        (["--cluster-timeout", "soon"], {}, "--cluster-timeout='soon'"),
        ([], {"PODGUARD_CLUSTER_TIMEOUT": "-5"}, "--cluster-timeout=-5"),
        ([], {"PODGUARD_CLUSTER_PORT": "70000"}, "PODGUARD_CLUSTER_PORT=70000"),
        (["--cluster-port", "x"], {}, "PODGUARD_CLUSTER_PORT='x'"),
        ([], {"PRIMARY_PORT": "65535"}, "PRIMARY_PORT + 1 = 65536"),
        ([], {"HOST_NODE_ADDR": "nohost", "PRIMARY_ADDR": ""}, "HOST_NODE_ADDR='nohost'"),
    ],
)
def test_bad_cluster_options_are_64_naming_the_value(tmp_path: Path, args: list[str], env: dict[str, str], named: str):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PODGUARD_", "PRIMARY_", "MASTER_"))}
    full.update(
        LD_LIBRARY_PATH="",
        PODGUARD_PROBE="off",
        PODGUARD_STATE_DIR=str(tmp_path / "state"),
        NUM_NODES="2",
        NODE_RANK="0",
        PRIMARY_ADDR="127.0.0.1",
    )
    full.update(env)
    proc = subprocess.run(
        [*PODGUARD, "train", "--mode", "torchrun", *args, "--", sys.executable, "-c", "pass"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 64, proc.stderr
    assert named in proc.stderr and "Traceback" not in proc.stderr
    assert "podguard train: PASS" not in proc.stderr  # refused before the preflight


# -------------------------------------------------------------------------------- the summary


def test_the_summary_names_failing_and_missing_nodes():
    sick = NodeVerdict(rank=3, word="UNHEALTHY", code=76, reasons=("UNHEALTHY GPU 5: 2 uncorrected ECC error(s)",))
    failed = GateOutcome(code=76, nnodes=4, node_rank=0, failed=(sick,), missing=(2,))
    text = format_gate_summary(failed)
    assert text.splitlines()[0] == "podguard cluster gate: FAIL (node 0 of 4): node(s) 3 failed; no node launches"
    assert "  node 3: UNHEALTHY GPU 5: 2 uncorrected ECC error(s)" in text
    assert "  not reported yet: node(s) 2" in text
    late = format_gate_summary(GateOutcome(code=75, nnodes=4, node_rank=1, missing=(2, 3)), timeout_s=600)
    assert "node(s) 2, 3 did not report within 600 s (--cluster-timeout)" in late
    ok = format_gate_summary(GateOutcome(code=0, nnodes=2, node_rank=1, waited_s=2.0, notes=("socket interface: x",)))
    assert "PASS: all 2 nodes passed" in ok and "waited 2.0 s" in ok and ok.endswith("  socket interface: x")
    assert ExitCode.GPU_UNHEALTHY == 76


def test_the_summary_is_not_mistaken_for_the_preflight_verdict_line_pod_up_follows():
    from podguard.pods.readiness import VERDICT_LINE

    outcome = GateOutcome(code=0, nnodes=2, node_rank=0)
    assert VERDICT_LINE.search(format_gate_summary(outcome)) is None


def test_verdicts_round_trip_through_the_store_text():
    v = NodeVerdict(rank=1, word="FAIL", code=69, reasons=("FAIL: expected 8 GPUs but this node has 4",), host="n1")
    assert NodeVerdict.from_json(v.to_json()) == v
    assert v.lines() == ["node 1: FAIL: expected 8 GPUs but this node has 4"]


def test_the_single_node_path_and_the_gate_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import podguard.cli.launch, podguard.job.conductor, podguard.job.multinode\n"
        "import podguard.launch.multinode.gate, podguard.launch.multinode.netif\n"
        "import podguard.launch.multinode.protocol\n"
        "sys.exit('torch' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

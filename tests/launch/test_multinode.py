"""Multi-node torchrun for real: two `podguard train --mode torchrun` processes on this host, as two nodes.

RunPod Instant Cluster variables (NUM_NODES, NODE_RANK, PRIMARY_ADDR, PRIMARY_PORT, NUM_TRAINERS) on CPU
with gloo: an all-reduce whose sum proves that all four ranks met, the NODE_RANK=0 node holding ranks 0
and 1, and a worker failing on one node stopping both nodes. Also: a full log volume under a real
torchrun job costs the logs, never the job.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loadfactor import load_factor
from loopback import cluster_node_env, free_port_pair

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

PODGUARD = [sys.executable, "-m", "podguard"]

TRAIN = textwrap.dedent(
    """
    import datetime, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank} of {world} on node {os.environ['GROUP_RANK']}: sum {int(total.item())}", flush=True)
    if os.environ.get("FAIL_RANK") == str(rank):
        print(f"rank {rank} failing on purpose", flush=True)
        os._exit(3)  # (sys.exit would run gloo's teardown, which aborts (-6) when a peer closed first: a race)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _two_nodes(tmp_path: Path, **extra: str) -> list[subprocess.CompletedProcess[str]]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    port = free_port_pair()
    procs = [
        subprocess.Popen(
            [*PODGUARD, "train", "--mode", "torchrun", "--grace", "3", "--", sys.executable, str(script)],
            env=cluster_node_env(tmp_path, rank, port, **extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (1, 0)  # the secondary first: it must wait for the primary, not fail
    ]
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    node1, node0 = results
    return [node0, node1]


def _ranks(out: str) -> dict[int, tuple[int, int, int]]:
    """rank -> (world, node, sum) from the `rankN:rank N of W on node K: sum S` lines."""
    found = {}
    for m in re.finditer(r"^rank(\d+):rank (\d+) of (\d+) on node (\d+): sum (\d+)$", out, re.MULTILINE):
        assert m.group(1) == m.group(2), m.group(0)  # the prefix names the rank that wrote the line
        found[int(m.group(2))] = (int(m.group(3)), int(m.group(4)), int(m.group(5)))
    return found


def test_two_nodes_meet_and_node_rank_0_holds_ranks_0_and_1(tmp_path: Path):
    node0, node1 = _two_nodes(tmp_path)
    assert node0.returncode == 0, node0.stdout[-3000:]
    assert node1.returncode == 0, node1.stdout[-3000:]
    assert _ranks(node0.stdout) == {0: (4, 0, 10), 1: (4, 0, 10)}  # 1+2+3+4: four ranks met
    assert _ranks(node1.stdout) == {2: (4, 1, 10), 3: (4, 1, 10)}


def test_a_worker_failing_on_one_node_stops_both_nodes(tmp_path: Path):
    started = time.monotonic()
    node0, node1 = _two_nodes(tmp_path, FAIL_RANK="3")
    assert node1.returncode == 3, node1.stdout[-3000:]  # the failing worker's own code
    assert "rank 3 (local rank 1, node 1) exited with code 3" in node1.stdout
    assert node0.returncode != 0, node0.stdout[-3000:]  # stopped too, not left hanging in a collective
    assert "another node may have failed first" in node0.stdout
    assert time.monotonic() - started < 200


def test_a_full_log_volume_under_a_real_torchrun_job_costs_the_logs_not_the_job(tmp_path: Path):
    from podguard.gpu.selected import Selection
    from podguard.launch.run import run_job
    from podguard.launch.torchrun.command import build_torchrun_spec
    from podguard.launch.torchrun.failure import explain_torchrun_failure

    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("torchrun.log", "rank0.log", "rank1.log"):
        (logs / name).symlink_to("/dev/full")
    script = tmp_path / "hello.py"
    script.write_text("import os\nfor i in range(200): print('rank', os.environ['RANK'], 'line', i, flush=True)\n")
    cpu = Selection(gpus=(), source="none", inventory_count=0)
    spec = build_torchrun_spec([sys.executable, str(script)], cpu, error_dir=tmp_path / "err", log_dir=logs, nproc=2)
    out_path = tmp_path / "out.txt"
    with out_path.open("wb") as out:
        outcome = explain_torchrun_failure(run_job([spec], terminal=out, summary=False), tmp_path / "err")
    text = out_path.read_text()
    assert outcome.exit_code == 0, text[-3000:]
    assert text.count("rank0:rank 0 line ") == 200 and text.count("rank1:rank 1 line ") == 200
    assert text.count("warning: log file") == 3  # torchrun.log (podguard), rank0.log and rank1.log (wrappers)


# --- issue 23, item 1: a hang is the job's verdict, not one node's ---------------------------------------------

RANK0_LOGS = textwrap.dedent(
    """
    import datetime, os, threading, time
    rank = int(os.environ["RANK"])
    loading = threading.Event()

    def say_loading():  # rank 0 logs while it starts (imports, rendezvous), as HF does
        while not loading.wait(1.0):
            print("rank 0 loading", flush=True)

    if rank == 0:
        threading.Thread(target=say_loading, daemon=True).start()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    loading.set()
    for step in range(int(os.environ["STEPS"])):
        dist.all_reduce(torch.ones(1))
        if rank == 0 and step % 9 == 0:
            print(f"step {step}", flush=True)  # only rank 0 logs, every 4.5 s (HF's logging_steps)
        time.sleep(0.5)
    if rank == 0:
        print("healthy phase over", flush=True)
    time.sleep(3600)  # then every rank of both nodes stops: a real hang
    """
)


def test_only_rank_0_logging_is_not_a_hang_on_node_1_and_a_real_hang_is_found_on_both(tmp_path: Path):
    """A healthy HF-style job: rank 0 (node 0) logs every N = 4.5 s under --hang-timeout 10 (about 2N): node 1,
    whose ranks print nothing, must not call the job hung (it did after 10 s, killing the cluster job); once
    every rank stops, both nodes find the hang."""
    script = tmp_path / "train.py"
    script.write_text(RANK0_LOGS)
    port = free_port_pair()
    # torchrun's start-up is silent: the hang timeout (10 s on an idle machine) and the healthy phase past it
    # (28 steps of 0.5 s) are stretched alike by the load factor (up to 3); rank 0 still logs every 4.5 s
    factor = min(load_factor(), 3.0)
    args = ["train", "--mode", "torchrun", "--grace", "2", "--hang-timeout", f"{10 * factor:.1f}"]
    procs = [
        subprocess.Popen(
            [*PODGUARD, *args, "--", sys.executable, str(script)],
            env=cluster_node_env(tmp_path, rank, port, STEPS=str(math.ceil(28 * factor))),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outs = [proc.communicate(timeout=150 * factor)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    node0, node1 = outs
    assert "rank0:healthy phase over" in node0, node0[-3000:]  # node 1 did not end the job while it trained
    for code, out in zip((procs[0].returncode, procs[1].returncode), outs, strict=True):
        assert code == 79, out[-3000:]
        hung = out.index("podguard: HUNG: no progress for ")
        assert hung > 0 and (out is node1 or hung > out.index("rank0:healthy phase over"))
    assert "last progress: progress on node 0" in node1  # what node 1 last heard was node 0's

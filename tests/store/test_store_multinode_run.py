"""Multi-node for real: two `podguard train --mode torchrun` processes on this host as two nodes (RunPod Instant
Cluster variables, CPU, gloo), each with its own disk (DIR). Every rank writes its shard of `step_5/` on its node's
disk, node 0 a COMPLETED marker after the barrier; the store gets the checkpoint whole (all four shards) only from
both nodes, and a new cluster (empty disks) restores it whole on every node."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from s3server import store_env

from loopback import cluster_node_env, free_port_pair

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

PODGUARD = [sys.executable, "-m", "podguard"]

TRAIN = textwrap.dedent(
    """
    import datetime, os, time
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    d = os.environ["PODGUARD_CHECKPOINTS"]  # this node's own disk
    resume = os.environ.get("PODGUARD_RESUME_FROM")
    if resume is not None:
        shards = sorted(n for n in os.listdir(resume) if n.endswith(".distcp"))
        print(f"rank {rank} resumed from {os.path.basename(resume)} with {shards}", flush=True)
    else:
        folder = os.path.join(d, "step_5")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"__{rank}_0.distcp"), "wb") as f:
            f.write(os.urandom(100_000 + rank))
        dist.barrier()  # every rank's shard is written
        if int(os.environ["LOCAL_RANK"]) == 0 and os.environ["GROUP_RANK"] == "0":
            open(os.path.join(folder, "COMPLETED"), "w").close()
        print(f"rank {rank} saved", flush=True)
        time.sleep(8)  # training goes on while the nodes store the checkpoint
    dist.barrier()
    dist.destroy_process_group()
    """
)


def two_nodes(tmp_path: Path, run: str, store: dict[str, str], url: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    port = free_port_pair()
    procs = []
    for rank in (1, 0):
        env = {
            **cluster_node_env(tmp_path / run, rank, port),
            **store,
            "PODGUARD_CHECKPOINTS": str(tmp_path / run / f"disk{rank}"),
            "PODGUARD_CHECKPOINT_STORE": url,
        }
        procs.append(
            subprocess.Popen(
                [*PODGUARD, "train", "--mode", "torchrun", "--grace", "3", "--", sys.executable, str(script)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out[-4000:]
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    node1, node0 = outs
    return [node0, node1]


def test_a_checkpoint_sharded_over_two_nodes_disks_is_stored_whole_and_restored_whole_on_both(tmp_path, s3):
    server, bucket = s3
    url = f"s3://{bucket}/cluster"
    env = {**store_env(server.url), "PODGUARD_STORE_NODE_TIMEOUT": "60"}
    node0, node1 = two_nodes(tmp_path, "first", env, url)
    assert f"podguard: stored node 1's files of step_5 in {url}" in node1, node1[-3000:]
    assert node0.count(f"podguard: stored step_5 in {url}") == 1, node0[-3000:]  # once: not again and again
    keys = server.keys(bucket, "cluster/step_5/")
    shards = sorted(k.rsplit("/", 1)[1] for k in keys if k.endswith(".distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"], keys
    assert "cluster/step_5/.podguard-manifest.json" in keys
    assert "; stored step_5 (step 5, written " in node1  # node 1's END names what node 0 committed

    node0, node1 = two_nodes(tmp_path, "second", env, url)  # a new cluster: empty disks
    want = "['__0_0.distcp', '__1_0.distcp', '__2_0.distcp', '__3_0.distcp']"
    for out in (node0, node1):
        assert f"podguard: restored step_5 (step 5) from {url}: " in out, out[-3000:]
        assert "podguard: stored step_5" not in out  # a restored checkpoint is not stored again
    for rank in range(4):
        assert f"rank {rank} resumed from step_5 with {want}" in node0 + node1

"""Multi-node: a checkpoint whose files several nodes write is whole in the store only when every node's files are
in (node 0 commits after the others reported through the store), on node-local disks and on a DIR every node
shares; every node restores it whole. Two mirrors (node 0, node 1) run against a real S3 server."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from podguard import console
from podguard.store.catalog import list_stored, newest_whole
from podguard.store.connect import open_backend
from podguard.store.mirror import Mirror
from podguard.store.nodes import NodeRole
from podguard.store.restore import restore_checkpoint
from podguard.store.url import parse_store_url


def shard(folder: Path, name: str, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(os.urandom(size))


def digest(folder: Path) -> dict[str, str]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def backend(s3):
    _server, bucket = s3
    b = open_backend(parse_store_url(f"s3://{bucket}/mn"))
    yield b
    b.close()


def mirrors(backend, dir0: Path, dir1: Path) -> tuple[Mirror, Mirror]:
    m0 = Mirror(backend, str(dir0), keep=2, poll_s=0.1, role=NodeRole(0, 2))
    m1 = Mirror(backend, str(dir1), keep=2, poll_s=0.1, role=NodeRole(1, 2))
    return m0, m1


def newest_whole_within(backend, seconds: float, lines: list[str]):
    """The store's newest whole checkpoint once there is one (the lines said so far when none came in time)."""
    deadline = time.monotonic() + seconds
    while (stored := newest_whole(backend)) is None:
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)
    return stored


def test_node_local_shards_are_whole_in_the_store_only_once_every_node_reported(backend, tmp_path, monkeypatch):
    """Each node writes its shard of step_100/ on its own disk; node 0 also writes the COMPLETED marker after the
    save's barrier (docs: how a custom or sharded format says it is done)."""
    monkeypatch.setenv("PODGUARD_STORE_NODE_TIMEOUT", "60")
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shard(node1 / "step_100", "__1_0.distcp", 300_000)  # node 1's shard
    shard(node0 / "step_100", "__0_0.distcp", 200_000)
    (node0 / "step_100" / "COMPLETED").write_text("")
    with console.captured() as lines:
        m0, m1 = mirrors(backend, node0, node1)
        m0.start()
        try:  # node 1 is not there yet: node 0 has asked, nothing is whole
            deadline = time.monotonic() + 30
            while backend.read_bytes(".podguard-request.json") is None:
                assert time.monotonic() < deadline, lines
                time.sleep(0.05)
            time.sleep(0.5)
            assert newest_whole(backend) is None
            assert [(s.name, s.whole) for s in list_stored(backend)] == [("step_100", False)]
            m1.start()  # node 1 answers with its shard; then node 0 commits
            stored = newest_whole_within(backend, 60, lines)
        finally:
            m0.close()
            m1.close()
        assert stored.manifest is not None and stored.manifest.nodes == 2
        assert sorted(f.path for f in stored.manifest.files) == ["COMPLETED", "__0_0.distcp", "__1_0.distcp"]
        assert any(line.startswith("podguard: stored node 1's files of step_100 in s3://") for line in lines), lines
        assert any(line.startswith("podguard: stored step_100 in s3://") for line in lines), lines

        union = {**digest(node0 / "step_100"), **digest(node1 / "step_100")}
        fresh = tmp_path / "new-node"  # a replaced node: an empty disk
        restore_checkpoint(backend, stored, str(fresh))
        assert digest(fresh / "step_100") == union
        restore_checkpoint(backend, stored, str(node1))  # node 1 keeps its shard and gets the rest
        assert digest(node1 / "step_100") == union


def test_a_node_that_never_reports_leaves_the_checkpoint_uncommitted(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("PODGUARD_STORE_NODE_TIMEOUT", "1")
    node0 = tmp_path / "node0"
    shard(node0 / "step_5", "__0_0.distcp", 1000)
    (node0 / "step_5" / "COMPLETED").write_text("")
    with console.captured() as lines:
        m0 = Mirror(backend, str(node0), keep=2, poll_s=0.1, role=NodeRole(0, 2))
        m0.start()
        try:
            deadline = time.monotonic() + 30
            while not any("did not report" in line for line in lines):
                assert time.monotonic() < deadline, lines
                time.sleep(0.05)
        finally:
            m0.close()
        assert newest_whole(backend) is None
        assert any("not storing step_5: node(s) 1 did not report their files of step_5 within 1 s" in x for x in lines)


def test_on_a_dir_every_node_shares_nothing_is_copied_twice(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("PODGUARD_STORE_NODE_TIMEOUT", "60")
    shared = tmp_path / "volume"
    shard(shared / "step_7", "__0_0.distcp", 100_000)
    shard(shared / "step_7", "__1_0.distcp", 100_000)
    (shared / "step_7" / "COMPLETED").write_text("")
    with console.captured() as lines:
        m0, m1 = mirrors(backend, shared, shared)
        m1.start()
        m0.start()
        try:
            stored = newest_whole_within(backend, 60, lines)
        finally:
            m0.close()
            m1.close()
        assert sorted(f.path for f in stored.manifest.files) == ["COMPLETED", "__0_0.distcp", "__1_0.distcp"]
        assert m1.uploaded_bytes == 0  # node 1 held nothing node 0 had not stored already
        assert "stored node 1's files of step_7 in" in "\n".join(lines)


def test_a_rank_0_only_save_is_committed_once_the_other_node_said_it_holds_nothing(backend, tmp_path, monkeypatch):
    """HF Trainer, Lightning or plain torch under DDP: rank 0 writes the whole checkpoint on node 0's disk; node 1
    holds nothing of it, reports so, and gets it whole on its restore."""
    from ckptfiles import hf_like

    monkeypatch.setenv("PODGUARD_STORE_NODE_TIMEOUT", "60")
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    folder = hf_like(node0, 40)
    node1.mkdir()
    with console.captured() as lines:
        m0, m1 = mirrors(backend, node0, node1)
        m0.start()
        m1.start()
        try:
            stored = newest_whole_within(backend, 60, lines)
        finally:
            m0.close()
            m1.close()
        assert stored.name == "checkpoint-40" and stored.manifest.nodes == 2
        assert m1.uploaded_bytes == 0
        restore_checkpoint(backend, stored, str(node1))
        assert digest(node1 / "checkpoint-40") == digest(folder)

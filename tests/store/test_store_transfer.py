"""The store's transfers against a real S3 server (moto's, on loopback) and a real folder (`file://`): files first
and the manifest last, a restore into an empty DIR byte for byte, multipart, an upload cut off or abandoned, and
`--store-keep`."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ckptfiles import hf_like, torch_file

from podguard import console
from podguard.checkpoints import find_checkpoints
from podguard.store.backend import Cancelled
from podguard.store.catalog import list_stored, newest_whole
from podguard.store.connect import open_backend
from podguard.store.restore import restore_checkpoint
from podguard.store.upload import upload_checkpoint
from podguard.store.url import parse_store_url


@pytest.fixture(params=["s3", "file"])
def store(request, tmp_path):
    """(the store's URL text, its backend) for a fresh S3 bucket or a fresh folder."""
    if request.param == "s3":
        _server, bucket = request.getfixturevalue("s3")
        text = f"s3://{bucket}/run1"
    else:
        text = f"file://{tmp_path / 'store'}"
    backend = open_backend(parse_store_url(text))
    backend.check()
    yield text, backend
    backend.close()


def digest(path: Path) -> dict[str, str]:
    if path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


class Recording:
    """The real backend, with the order of the keys it was asked to write (upload_file and write_bytes)."""

    def __init__(self, backend):
        self.backend = backend
        self.written: list[str] = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def upload_file(self, path, key, size, crc, progress):
        self.backend.upload_file(path, key, size, crc, progress)
        self.written.append(key)

    def write_bytes(self, key, data):
        self.backend.write_bytes(key, data)
        self.written.append(key)


def test_files_go_first_and_the_manifest_last_then_a_new_pod_restores_it_byte_for_byte(store, tmp_path):
    _url, backend = store
    pod1 = tmp_path / "pod1"
    folder = hf_like(pod1, 5)
    checkpoint = find_checkpoints(pod1).chosen
    assert checkpoint is not None
    recording = Recording(backend)
    manifest = upload_checkpoint(recording, checkpoint, str(pod1), progress=lambda n: None)
    assert recording.written[-1] == "checkpoint-5/.podguard-manifest.json"
    assert sorted(recording.written[:-1]) == sorted(f"checkpoint-5/{f.rel}" for f in _files(folder))
    assert manifest.step == 5 and manifest.layout == "hf-trainer"

    stored = newest_whole(backend)
    assert stored is not None and stored.name == "checkpoint-5" and stored.whole
    pod2 = tmp_path / "pod2"  # a new pod: DIR does not even exist
    path = restore_checkpoint(backend, stored, str(pod2))
    assert path == str(pod2 / "checkpoint-5")
    assert digest(pod2 / "checkpoint-5") == digest(folder)
    again = find_checkpoints(pod2).chosen  # the finder sees it as it was written: same step, mtime, size
    assert again is not None and (again.step, again.mtime, again.size) == (5, checkpoint.mtime, checkpoint.size)
    assert [p.name for p in pod2.iterdir()] == ["checkpoint-5"]  # no hidden folder left behind


def _files(folder: Path):
    from podguard.store.upload import checkpoint_files

    return checkpoint_files(str(folder))


def test_a_single_file_checkpoint_is_stored_beside_its_manifest(store, tmp_path):
    _url, backend = store
    pod1 = tmp_path / "pod1"
    torch_file(pod1 / "step-9.pt")
    checkpoint = find_checkpoints(pod1).chosen
    upload_checkpoint(backend, checkpoint, str(pod1), progress=lambda n: None)
    folders, files = backend.list_top()
    assert set(files) == {"step-9.pt", "step-9.pt.podguard-manifest.json"} and not folders
    stored = newest_whole(backend)
    restore_checkpoint(backend, stored, str(tmp_path / "pod2"))
    assert digest(tmp_path / "pod2" / "step-9.pt") == digest(pod1 / "step-9.pt")


def test_a_file_above_the_multipart_threshold_goes_in_parts_and_comes_back_whole(s3, tmp_path):
    server, bucket = s3
    backend = open_backend(parse_store_url(f"s3://{bucket}/big"))
    pod1 = tmp_path / "pod1"
    folder = hf_like(pod1, 3, size=12 * 2**20 + 123)  # 5 MiB parts (store_env): three parts
    upload_checkpoint(backend, find_checkpoints(pod1).chosen, str(pod1), progress=lambda n: None)
    head = server.client().head_object(Bucket=bucket, Key="big/checkpoint-3/extra.dat")
    assert head["ETag"].strip('"').endswith("-3")  # S3's multipart ETag: md5-of-parts "-<parts>"
    restore_checkpoint(backend, newest_whole(backend), str(tmp_path / "pod2"))
    assert digest(tmp_path / "pod2" / "checkpoint-3") == digest(folder)


def test_a_checkpoint_deleted_during_its_upload_is_abandoned_and_never_half_committed(store, tmp_path):
    _url, backend = store
    pod1 = tmp_path / "pod1"
    folder = hf_like(pod1, 7, size=2 * 2**20)
    checkpoint = find_checkpoints(pod1).chosen
    calls = [0]

    def progress(n: int) -> None:  # HF's save_total_limit rotation deletes it while it is being copied
        calls[0] += 1
        if calls[0] == 2:
            import shutil

            shutil.rmtree(folder)

    with pytest.raises(Cancelled, match="deleted"):
        upload_checkpoint(backend, checkpoint, str(pod1), progress=progress)
    assert newest_whole(backend) is None
    folders, files = backend.list_top()
    assert not any(backend.list_tree(f) for f in folders) and not files  # what was copied went again


def test_an_upload_killed_half_way_is_never_restored(store, tmp_path):
    """podguard SIGKILLed (the host died) in the middle of an upload: its files are there, its manifest is not."""
    url, backend = store
    pod1 = tmp_path / "pod1"
    hf_like(pod1, 1)
    upload_checkpoint(backend, find_checkpoints(pod1).chosen, str(pod1), progress=lambda n: None)
    hf_like(pod1, 2, size=40 * 2**20)
    child = textwrap.dedent(
        f"""
        import sys, threading, time
        from podguard.checkpoints import find_checkpoints
        from podguard.store.connect import open_backend
        from podguard.store.url import parse_store_url
        from podguard.store.upload import upload_checkpoint
        backend = open_backend(parse_store_url({url!r}))
        seen, lock = [0, False], threading.Lock()
        def progress(n):  # called from the transfer manager's threads: "half" is said once, in one write
            with lock:
                seen[0] += n
                first = seen[0] > 6 * 2**20 and not seen[1]
                seen[1] = seen[1] or first
            if first:
                sys.stdout.write("half\\n")
                sys.stdout.flush()
            if seen[1]:
                time.sleep(60)
        upload_checkpoint(backend, find_checkpoints({str(pod1)!r}).chosen, {str(pod1)!r}, progress=progress)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "half"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stored = list_stored(backend)
    assert [(s.name, s.whole) for s in stored] == [("checkpoint-2", False), ("checkpoint-1", True)]
    assert "no manifest" in stored[0].why
    pod2 = tmp_path / "pod2"
    restore_checkpoint(backend, newest_whole(backend), str(pod2))
    assert [p.name for p in pod2.iterdir()] == ["checkpoint-1"]


def test_store_keep_deletes_older_checkpoints_only_after_a_newer_one_is_whole(store, tmp_path):
    from podguard.store.mirror import Mirror

    url, backend = store
    pod1 = tmp_path / "pod1"
    with console.captured() as lines:
        mirror = Mirror(backend, str(pod1), keep=2, poll_s=0.1)
        mirror.start()
        try:
            for step in (1, 2, 3):
                hf_like(pod1, step)
                checkpoint = find_checkpoints(pod1).chosen
                assert mirror.wait_for(checkpoint, 60), lines
                want = [f"checkpoint-{s}" for s in range(step, max(0, step - 2), -1)]
                deadline = time.monotonic() + 30  # (the older ones go right after the newer one is whole)
                while (names := [s.name for s in list_stored(backend) if s.whole]) != want:
                    assert time.monotonic() < deadline, (names, lines)
                    time.sleep(0.05)
        finally:
            mirror.close()
        assert any(line.startswith(f"podguard: stored checkpoint-3 in {url} (") for line in lines), lines
        assert f"podguard: store {url}: removed checkpoint-1 (--store-keep 2)" in lines
        folders, _files = backend.list_top()
        assert folders == {"checkpoint-2", "checkpoint-3"}  # checkpoint-1's files went with its manifest


def test_the_manifest_names_every_file_with_its_size_and_crc32(store, tmp_path):
    import json
    import zlib

    _url, backend = store
    pod1 = tmp_path / "pod1"
    folder = hf_like(pod1, 4)
    upload_checkpoint(backend, find_checkpoints(pod1).chosen, str(pod1), progress=lambda n: None)
    data = json.loads(backend.read_bytes("checkpoint-4/.podguard-manifest.json"))
    assert data["format"] == "podguard-checkpoint/1" and data["step"] == 4 and data["kind"] == "folder"
    by_path = {f["path"]: f for f in data["files"]}
    for p in folder.rglob("*"):
        if p.is_file():
            f = by_path[str(p.relative_to(folder))]
            assert f["size"] == p.stat().st_size
            assert f["crc32"] == f"{zlib.crc32(p.read_bytes()):08x}"
    assert time.time() - data["stored_at"] < 120


def test_a_restore_killed_before_its_rename_leaves_a_hidden_folder_the_next_restore_removes(store, tmp_path):
    _url, backend = store
    pod1 = tmp_path / "pod1"
    hf_like(pod1, 8)
    upload_checkpoint(backend, find_checkpoints(pod1).chosen, str(pod1), progress=lambda n: None)
    pod2 = tmp_path / "pod2"
    stale = pod2 / ".podguard-restore-checkpoint-8-999999999"  # a podguard that was SIGKILLed mid-download
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    assert find_checkpoints(pod2).checkpoints == ()  # the finder never takes it for a checkpoint
    restore_checkpoint(backend, newest_whole(backend), str(pod2))
    assert sorted(p.name for p in pod2.iterdir()) == ["checkpoint-8"]


def test_parts_never_exceed_runpods_500_mb_and_never_number_more_than_10000():
    from podguard.store.s3 import PART_MAX, chunk_for

    for size in (1, 10**9, 160 * 10**9, 10**12, 3 * 10**12, 4 * 10**12, 5 * 10**12):  # up to S3's 5 TB
        chunk = chunk_for(size, 16 * 2**20)
        assert chunk <= PART_MAX == 500 * 10**6
        assert -(-size // chunk) <= 10_000, (size, chunk)


def test_a_multi_node_run_gives_the_mirror_its_node_role(tmp_path):
    from podguard.job.options import CheckpointSettings
    from podguard.job.store import open_store_sync
    from podguard.store.nodes import NodeRole
    from podguard.store.url import parse_store_url

    url = parse_store_url(f"file://{tmp_path / 'store'}")
    for nnodes, rank, role in ((None, None, None), (2, 1, NodeRole(1, 2)), (3, 0, NodeRole(0, 3))):
        checkpoints = CheckpointSettings(tmp_path / "ckpt", store=url)
        sync = open_store_sync(checkpoints, nnodes=nnodes, node_rank=rank)
        assert sync is not None and sync.mirror.role == role
        sync.close()

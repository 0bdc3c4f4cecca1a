"""`podguard checkpoints DIR --store URL`: the store's checkpoints beside DIR's, whole or why not, and which one a
new attempt would restore."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import pytest
from ckptfiles import hf_like

from podguard.checkpoints import find_checkpoints
from podguard.store.connect import open_backend
from podguard.store.upload import upload_checkpoint
from podguard.store.url import parse_store_url


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podguard", "checkpoints", *args], capture_output=True, text=True)


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_the_store_is_listed_beside_dir_with_what_a_new_pod_would_restore(tmp_path, s3, kind):
    _server, bucket = s3
    url = f"s3://{bucket}/run1" if kind == "s3" else f"file://{tmp_path / 'store'}"
    backend = open_backend(parse_store_url(url))
    backend.check()
    pod1 = tmp_path / "pod1"
    hf_like(pod1, 100)
    upload_checkpoint(backend, find_checkpoints(pod1).chosen, str(pod1), progress=lambda n: None)
    hf_like(pod1, 200)
    config = pod1 / "checkpoint-200" / "config.json"
    backend.upload_file(str(config), "checkpoint-200/config.json", 2, zlib.crc32(config.read_bytes()), print)
    # (a cut-off upload: one file, no manifest)

    proc = cli(str(tmp_path / "new-pod"), "--store", url)  # a new pod: DIR not there yet
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row200 = next(line for line in lines if "checkpoint-200" in line)
    row100 = next(line for line in lines if "checkpoint-100" in line)
    assert row200.endswith("no: no manifest (its upload did not finish)")
    assert row100.startswith("* checkpoint-100") and row100.endswith(" yes")
    assert f"in the store {url}" in lines
    assert "the next attempt would restore checkpoint-100 from the store (*): newer than DIR's newest" in lines

    proc = cli(str(pod1), "--store", url, "--json")  # DIR's own checkpoint-200 is newer: nothing to restore
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["resume_from"] == str(pod1 / "checkpoint-200")
    store = data["store"]
    assert store["url"] == url and store["restore"] is None
    assert [(c["name"], c["whole"], c["step"]) for c in store["checkpoints"]] == [
        ("checkpoint-200", False, 200),
        ("checkpoint-100", True, 100),
    ]


def test_a_bad_store_is_64_and_a_missing_bucket_names_it(tmp_path, s3):
    proc = cli(str(tmp_path), "--store", "ftp://x/y")
    assert proc.returncode == 64 and "--store='ftp://x/y' has scheme 'ftp://'" in proc.stderr
    proc = cli(str(tmp_path), "--store", "s3://no-such-bucket-here/run1")
    assert proc.returncode == 64 and "the bucket 'no-such-bucket-here' does not exist" in proc.stderr
    proc = cli(str(tmp_path / "missing"))  # without --store a missing DIR is still 64
    assert proc.returncode == 64

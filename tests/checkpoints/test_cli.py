"""`podguard checkpoints DIR [--json]` as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import writers as w


def podguard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podguard", "checkpoints", *args], capture_output=True, text=True)


def test_the_table_lists_newest_first_and_marks_the_one_a_restart_uses(tmp_path):
    w.hf_checkpoint(tmp_path, 100)
    w.age(tmp_path / "checkpoint-100", 3600)
    broken = w.hf_checkpoint(tmp_path, 200)
    (broken / "trainer_state.json").write_text('{"global_st')
    proc = podguard(str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert rows[0].split() == ["NAME", "LAYOUT", "STEP", "SIZE", "WRITTEN", "WHOLE"]
    assert rows[1].split()[:3] == ["checkpoint-200", "hf-trainer", "200"]
    assert rows[1].endswith("no: trainer_state.json does not parse (cut short?)")
    assert rows[2].split()[:4] == ["*", "checkpoint-100", "hf-trainer", "100"] and rows[2].endswith("yes")
    assert "(1h ago)" in rows[2]
    assert rows[-1] == f"a restart would resume from {tmp_path / 'checkpoint-100'} (*)"


def test_json_and_an_empty_dir_are_exit_0(tmp_path):
    proc = podguard(str(tmp_path), "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {
        "directory": str(tmp_path),
        "unreadable": None,
        "resume_from": None,
        "resume_step": None,
        "checkpoints": [],
    }
    w.torch_file(tmp_path / "step-3.pt")
    data = json.loads(podguard(str(tmp_path), "--json").stdout)
    (c,) = data["checkpoints"]
    assert (c["layout"], c["step"], c["whole"], c["chosen"], c["why_not"]) == ("torch", 3, True, True, None)
    assert c["size_bytes"] == (tmp_path / "step-3.pt").stat().st_size and c["written_at"].endswith("Z")


def test_a_missing_dir_is_64_in_one_line(tmp_path):
    proc = podguard(str(tmp_path / "nope"))
    assert proc.returncode == 64
    assert proc.stderr.strip() == (
        f"podguard: error: checkpoints DIR='{tmp_path / 'nope'}' does not exist; give the folder the job writes "
        "its checkpoints to"
    )


@pytest.fixture
def as_user(tmp_path):
    """`podguard checkpoints` as an ordinary user (root reads everything: setpriv drops to nobody), in a folder
    that user may walk to."""
    if os.geteuid() != 0:
        yield tmp_path, []
        return
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a folder unreadable")
    root = Path(tempfile.mkdtemp(prefix="podguard-perm-"))
    root.chmod(0o755)
    try:
        yield root, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    finally:
        for p in [root, *root.rglob("*")]:
            if not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(root)


def test_an_unreadable_checkpoint_is_named_and_an_unreadable_dir_is_a_warning_not_64(as_user):
    root, prefix = as_user
    ckpt = root / "ckpt"
    for step in (100, 200):
        w.hf_checkpoint(ckpt, step)
    for p in [ckpt, *ckpt.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (ckpt / "checkpoint-200").chmod(0)
    cli = [*prefix, sys.executable, "-m", "podguard", "checkpoints", str(ckpt)]
    proc = subprocess.run(cli, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].endswith("no: checkpoint-200 cannot be read (Permission denied)")
    assert proc.stdout.splitlines()[-1] == f"a restart would resume from {ckpt / 'checkpoint-100'} (*)"
    ckpt.chmod(0)  # what `train` does before each attempt: a warning, and a start from scratch (never 64)
    proc = subprocess.run(cli, capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    why = "(Permission denied): a restart would start from scratch"
    assert proc.stderr.strip() == f"podguard: warning: cannot read {ckpt} {why}"
    assert proc.stdout.splitlines() == [f"cannot read {ckpt} (Permission denied)", "a restart would start from scratch"]
    proc = subprocess.run([*cli, "--json"], capture_output=True, text=True)
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert (data["unreadable"], data["resume_from"], data["checkpoints"]) == ("Permission denied", None, [])


@pytest.mark.parametrize("bad", ["", " "])
def test_an_empty_dir_argument_is_64_in_one_line(bad):
    proc = podguard(bad)
    assert proc.returncode == 64
    assert proc.stderr.strip() == (
        f"podguard: error: checkpoints DIR={bad!r} is empty (an unset variable?); give the folder the job writes "
        "its checkpoints to"
    )


def test_a_dir_that_is_a_file_is_64(tmp_path):
    (tmp_path / "f").write_text("")
    proc = podguard(str(tmp_path / "f"))
    assert proc.returncode == 64 and "is not a folder" in proc.stderr

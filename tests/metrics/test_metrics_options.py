"""`--metrics-port` / `--metrics-file` refused before the job starts: a taken port, an invalid one, a file that
cannot be written. One line naming the value, exit 64, no traceback, and the job never ran.

Why: a metrics port that silently fails to bind leaves a dashboard empty for a whole run; a port already taken
by a second podguard on the same pod must be said at once, not after the preflight and the launch.
"""

from __future__ import annotations

import os
import socket
import stat
import sys

import pytest
from metrics_support import free_port, start


def refused(node, tmp_path, args: list[str], **env: str) -> str:
    marker = tmp_path / "ran"
    proc = start(node, ["run", *args, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], **env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 64, out + err
    assert not marker.exists(), "the job must not start"
    assert "Traceback" not in err and "PASS" not in err  # (before the preflight)
    return err


def test_a_taken_port_is_64_before_the_job_starts(cli_node, tmp_path):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", port))
        taken.listen()
        err = refused(cli_node, tmp_path, ["--metrics-port", str(port)])
    assert f"--metrics-port={port}: port {port} is taken by another process" in err


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--metrics-port", "70000"], {}, "--metrics-port=70000 is not valid; expected an integer 1-65535"),
        (["--metrics-port", "nine"], {}, "--metrics-port='nine' is not a whole number; expected an integer 1-65535"),
        ([], {"PODGUARD_METRICS_PORT": "0"}, "--metrics-port=0 is not valid; expected an integer 1-65535"),
        (
            [],
            {"PODGUARD_METRICS_PORT": "9464", "PODGUARD_METRICS_INTERVAL": "soon"},
            "PODGUARD_METRICS_INTERVAL='soon'",
        ),
        (  # the rendezvous would find its port taken by podguard itself, after the preflight, as "another program"
            ["--metrics-port", "29555"],
            {"MASTER_PORT": "29555"},
            "--metrics-port=29555 is also the rendezvous port (--master-port or MASTER_PORT)",
        ),
    ],
    ids=["too-big", "not-a-number", "zero-from-env", "bad-interval", "the-master-port"],
)
def test_an_invalid_port_is_64_naming_it(cli_node, tmp_path, args, env, said):
    assert said in refused(cli_node, tmp_path, args, **env)


def test_a_metrics_file_that_cannot_be_written_is_64_naming_it(cli_node, tmp_path):
    path = tmp_path / "no-such-folder" / "podguard.prom"
    err = refused(cli_node, tmp_path, ["--metrics-file", str(path)])
    assert f"--metrics-file='{path}' cannot be written" in err


def test_a_port_refused_after_the_file_was_opened_leaves_nothing_behind(cli_node, tmp_path):
    port, path = free_port(), tmp_path / "podguard.prom"
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", port))
        taken.listen()
        refused(cli_node, tmp_path, ["--metrics-port", str(port), "--metrics-file", str(path)])
    assert not path.exists()  # the port is checked first: a refused run writes no metrics


def test_a_sweeps_runs_do_not_inherit_one_metrics_port_or_file():
    from podguard.job.sweep import SweepRun, sweep_env

    base = {"PODGUARD_METRICS_PORT": "9464", "PODGUARD_METRICS_FILE": "/x/podguard.prom", "KEEP": "1"}
    env = sweep_env(SweepRun(index=1, gpus=("2", "3")), 2, base)
    assert "PODGUARD_METRICS_PORT" not in env and "PODGUARD_METRICS_FILE" not in env and env["KEEP"] == "1"


def _device_node(path) -> bool:
    """A character device like /dev/null (1, 3), made in the test's folder (never a system path); False where the
    user may not make one (CAP_MKNOD)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        return False
    return True


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device", "directory"])
def test_a_metrics_file_that_is_not_a_regular_file_is_64_naming_it_and_left_alone(cli_node, tmp_path, kind):
    """Each write is a rename over PATH: it would replace a FIFO (its reader never sees a byte), a symlink (its
    target keeps its old text), a device node (as root, /dev/full became a text file) with a regular file."""
    path = tmp_path / "podguard.prom"
    target = tmp_path / "target.prom"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        target.write_text("old text\n")
        path.symlink_to(target)
    elif kind == "device" and not _device_node(path):
        pytest.skip("no CAP_MKNOD here: a device node cannot be made")
    elif kind == "directory":
        path.mkdir()
    before = os.lstat(path)
    err = refused(cli_node, tmp_path, ["--metrics-file", str(path)])
    said = {"fifo": "a FIFO", "symlink": "a symbolic link", "device": "a character device", "directory": "a directory"}
    assert f"--metrics-file='{path}' is {said[kind]}" in err and "not a regular file" in err, err
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), "it must be left as it was"
    if kind == "symlink":
        assert target.read_text() == "old text\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary file left"


def test_an_empty_metrics_file_is_64_not_ignored(cli_node, tmp_path):
    err = refused(cli_node, tmp_path, ["--metrics-file", ""])
    assert "--metrics-file='' is empty" in err, err
    err = refused(cli_node, tmp_path, ["--metrics-file=  "])
    assert "--metrics-file='  ' is empty" in err, err


def test_an_empty_metrics_file_variable_is_unset_like_every_variable(cli_node, tmp_path):
    proc = start(cli_node, ["run", "--", sys.executable, "-c", "pass"], PODGUARD_METRICS_FILE="")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "podguard: metrics:" not in err and "--metrics-file" not in err


def test_a_regular_file_is_replaced_and_a_new_one_made(cli_node, tmp_path):
    old, new = tmp_path / "old.prom", tmp_path / "new.prom"
    old.write_text("stale\n")
    for path in (old, new):
        proc = start(cli_node, ["run", "--metrics-file", str(path), "--", sys.executable, "-c", "pass"])
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "podguard_up 0.0" in path.read_text() and stat.S_ISREG(os.lstat(path).st_mode)

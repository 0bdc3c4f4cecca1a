"""`--metrics-port` / `--metrics-file` refused before the job starts: a taken port, an invalid one, a file that
cannot be written. One line naming the value, exit 64, no traceback, and the job never ran.

Why: a metrics port that silently fails to bind leaves a dashboard empty for a whole run; a port already taken
by a second podguard on the same pod must be said at once, not after the preflight and the launch.
"""

from __future__ import annotations

import socket
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
    from podguard.launch.sweep import SweepRun, sweep_env

    base = {"PODGUARD_METRICS_PORT": "9464", "PODGUARD_METRICS_FILE": "/x/podguard.prom", "KEEP": "1"}
    env = sweep_env(SweepRun(index=1, gpus=("2", "3")), 2, base)
    assert "PODGUARD_METRICS_PORT" not in env and "PODGUARD_METRICS_FILE" not in env and env["KEEP"] == "1"

"""Exactly one END line per run, also for a run refused before it began: inside a pod a keeper reads the pod's log
for it (`pod keep`), and without it a container that restarts into the same refusal would bill on unwatched."""

from __future__ import annotations

import socket
import sys

from jobproc import run_podguard

END_64 = "END preflight exit 64 after 0 attempt(s): "


def _ends(text: str) -> list[str]:
    return [line for line in text.splitlines() if ": END " in line]


def test_a_bad_option_inside_a_pod_says_end_preflight_64_once(cli_node):
    proc = run_podguard(
        cli_node,
        ["run", "--save-grace", "0", "--", sys.executable, "-c", "pass"],
        env={"RUNPOD_POD_ID": "p1"},
        cpu=True,
    )
    assert proc.returncode == 64, proc.stderr
    (end,) = _ends(proc.stderr)
    assert end.startswith("podguard run: " + END_64) and "--save-grace" in end
    assert "Traceback" not in proc.stderr


def test_an_unknown_flag_inside_a_pod_says_end_too(cli_node):
    proc = run_podguard(
        cli_node, ["train", "--no-such-flag", "--", sys.executable, "-c", "pass"], env={"RUNPOD_POD_ID": "p1"}, cpu=True
    )
    assert proc.returncode == 64, proc.stderr
    (end,) = _ends(proc.stderr)
    assert end.startswith("podguard train: " + END_64) and "--no-such-flag" in end


def test_outside_a_pod_a_bad_option_stays_one_line(cli_node):
    proc = run_podguard(cli_node, ["run", "--save-grace", "0", "--", sys.executable, "-c", "pass"], cpu=True)
    assert proc.returncode == 64 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_run_refused_once_it_began_says_end_once(cli_node, tmp_path):
    """A taken metrics port is refused after the options were read (the port is bound then): the run began."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["run", "--metrics-port", str(port), "--", sys.executable, "-c", "pass"]
        proc = run_podguard(cli_node, args, env={"RUNPOD_POD_ID": "p1"}, cpu=True)
    assert proc.returncode == 64, proc.stderr
    (end,) = _ends(proc.stderr)
    assert end.startswith("podguard run: " + END_64) and str(port) in end

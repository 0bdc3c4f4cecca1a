"""What a cheap command loads: each `# noqa: PLC0415  lazy: ...` mark in product code names a path that must not load
the module; these tests hold those paths to it (docs/development.md, "The house rules")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# main() ends with sys.exit; the modules loaded by then are written to the file named by argv[1]
LOADED_BY = """
import json, sys
from podguard.cli.app import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
with open(sys.argv[1], "w") as f:
    json.dump(sorted(sys.modules), f)
"""

# what `podguard run` (a job's start-up path, single mode, no checkpoints, no metrics, one node) must not load
NOT_ON_RUN = (
    "podguard.job.sweep",  # cli/sweep.py: `podguard sweep` only
    "podguard.preflight.inventory",
    "podguard.launch.torchrun",  # torchrun mode or multi-node only
    "podguard.launch.roles",  # roles mode only
    "podguard.launch.prepare",  # --prepare only
    "podguard.launch.multinode.gate",  # multi-node only
    "podguard.guards.save",  # --save-signal only
    "podguard.guards.end",  # a guard tripped
    "podguard.pods.selfheal",  # self-heal or --on-exit stop-pod only
    "podguard.rank.wrap",  # the rank wrapper's own process
    "podguard.metrics.server",  # --metrics-port / --metrics-file: prometheus_client
    "prometheus_client",
    "torch",
    "docker",
    "runpod",
)


def _loaded(args: list[str], env: dict[str, str], tmp_path) -> list[str]:
    out = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", LOADED_BY, str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.exists(), proc.stderr[-2000:]
    return json.loads(out.read_text())


def _hits(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


@pytest.mark.slow
def test_podguard_run_loads_none_of_the_modules_its_lazy_imports_keep_back(cli_node, tmp_path):
    env = {**cli_node.env, "LD_LIBRARY_PATH": ""}  # CPU only: the single-mode job runs at once
    modules = _loaded(["run", "--", sys.executable, "-c", "pass"], env, tmp_path)
    assert "podguard.job.conductor" in modules  # the run did run
    assert _hits(modules, NOT_ON_RUN) == []


def test_pod_help_loads_no_api_client_and_no_command_module(tmp_path):
    modules = _loaded(["pod", "--help"], dict(os.environ), tmp_path)
    assert "podguard.cli.pods" in modules
    lazy = ("podguard.pods.api", "podguard.pods.spec", "podguard.pods.up", "podguard.pods.keeper", "http.client")
    assert _hits(modules, (*lazy, "runpod", "docker")) == []

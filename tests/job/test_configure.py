"""One `configure()` makes every exit-64 check of `train`/`run` (job/configure.py), before anything runs.

The checks used to be spread over the CLI, the conductor's opening and the first attempt; a value refused late was
said as a run that began (END outside a pod too) and some were never counted by the restart guard. Here every one
is refused by `configure()` itself, with its message as before, and the `podguard` command treats each alike: a
configuration refusal, one line outside a pod, counted for the crash-loop backoff."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jobproc import run_podguard
from podguard.errors import ExitCode, UsageError
from podguard.job.configure import JobSettings, configure
from podguard.job.options import CheckpointSettings, JobOptions, MetricsSettings
from podguard.launch.config import LaunchMode, OnExit
from podguard.preflight.options import PreflightOptions

CLUSTER = {"NUM_NODES": "2", "NODE_RANK": "0", "PRIMARY_ADDR": "127.0.0.1", "PRIMARY_PORT": "29555"}
NODES = {"nnodes": 2, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29555, "mode": LaunchMode.TORCHRUN}

# (where the check lived before, the options, the environment, the start of the message)
CASES = [
    ("launch/config", JobOptions(mode=LaunchMode.ROLES), {}, "--mode=roles needs --job-file FILE"),
    ("launch/config", JobOptions(prepare="  "), {}, "--prepare is empty"),
    ("selfheal.check_stop_pod", JobOptions(on_exit=OnExit.STOP_POD), {}, "--on-exit=stop-pod needs RUNPOD_POD_ID"),
    ("conductor.check_restarts", JobOptions(restarts=2, **NODES), CLUSTER, "--restarts=2 relaunches one node's"),
    ("guards.from_options", JobOptions(idle_stop=60.0), {"PODGUARD_GUARD_INTERVAL": "soon"}, "PODGUARD_GUARD_"),
    ("guards.check_guards", JobOptions(max_cost=5.0), {}, "--max-cost needs RUNPOD_POD_ID"),
    ("conductor._self_heal_config", JobOptions(), {"PODGUARD_SELF_HEAL": "sometimes"}, "PODGUARD_SELF_HEAL="),
    ("conductor._self_heal_config", JobOptions(), {"PODGUARD_SELF_HEAL_AFTER": "0"}, "PODGUARD_SELF_HEAL_AFTER="),
    ("conductor._self_heal_config", JobOptions(), {"PODGUARD_PARK": "later"}, "PODGUARD_PARK='later'"),
    (
        "metrics/run._interval",
        JobOptions(metrics_port=9464),
        {"PODGUARD_METRICS_INTERVAL": "soon"},
        "PODGUARD_METRICS_INTERVAL='soon' is not valid",
    ),
    (
        "conductor: cluster_gate_settings at the first attempt",
        JobOptions(**NODES, cluster_port=29555),
        CLUSTER,
        "PODGUARD_CLUSTER_PORT=29555 is the rendezvous port",
    ),
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in (
        "RUNPOD_POD_ID", "RUNPOD_API_KEY", "MASTER_PORT", "PODGUARD_GUARD_INTERVAL", "PODGUARD_METRICS_INTERVAL",
        "PODGUARD_SELF_HEAL", "PODGUARD_SELF_HEAL_AFTER", "PODGUARD_PARK", *CLUSTER,
    ):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize(("before", "options", "env", "message"), CASES, ids=[c[0] for c in CASES])
def test_every_check_is_made_by_configure(clean_env, before, options, env, message):
    for key, value in env.items():
        clean_env.setenv(key, value)
    with pytest.raises(UsageError) as info:
        configure(["python", "train.py"], options, PreflightOptions())
    assert info.value.code == ExitCode.USAGE
    assert info.value.message.startswith(message), info.value.message


def test_the_composed_settings_carry_each_rooms_own_part(clean_env, tmp_path: Path):
    clean_env.setenv("PODGUARD_SELF_HEAL", "restart")
    clean_env.setenv("PODGUARD_METRICS_INTERVAL", "0.5")
    options = JobOptions(max_runtime=60.0, metrics_file=tmp_path / "m.prom", restarts=2, on_exit=OnExit.IDLE)
    settings = configure(["python", "train.py"], options, PreflightOptions())
    assert isinstance(settings, JobSettings)
    assert settings.launch.argv == ("python", "train.py") and settings.launch.options == options.launch()
    assert not hasattr(settings.launch.options, "max_runtime")  # the launcher's options: the launcher's part only
    assert settings.guards is not None and settings.guards.max_runtime_s == 60.0
    assert settings.self_heal is not None and settings.self_heal.mode == "restart"
    assert settings.metrics == MetricsSettings(None, tmp_path / "m.prom", 0.5) and settings.gate is None
    assert (settings.restarts, settings.on_exit, settings.checkpoints) == (2, OnExit.IDLE, None)


def test_the_checkpoint_options_become_the_checkpoints_settings(clean_env, tmp_path: Path):
    options = JobOptions(checkpoints=tmp_path / "ckpt", save_signal=10, save_grace=30.0, store_keep=3)
    settings = configure(["python", "train.py"], options, PreflightOptions())
    assert settings.checkpoints == CheckpointSettings(tmp_path / "ckpt", 10, 30.0, None, 3)


def test_a_multi_node_run_has_its_gate_settled_before_the_run(clean_env):
    for key, value in CLUSTER.items():
        clean_env.setenv(key, value)
    settings = configure(["python", "train.py"], JobOptions(**NODES), PreflightOptions())
    assert settings.gate is not None and (settings.gate.nnodes, settings.gate.port) == (2, 29556)


# -- the command: a refusal of the configuration, whichever room checks it ---------------------------------------


def _history(state: Path) -> list[dict]:
    records = sorted((state / "jobs").glob("*.json"))
    return [run for path in records for run in json.loads(path.read_text())["history"]]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--metrics-port", "9464"], {"PODGUARD_METRICS_INTERVAL": "soon"}, "PODGUARD_METRICS_INTERVAL='soon'"),
        ([], {"PODGUARD_SELF_HEAL": "sometimes"}, "PODGUARD_SELF_HEAL='sometimes'"),
    ],
    ids=["metrics-interval", "self-heal"],
)
def test_a_bad_variable_is_a_configuration_refusal_like_a_bad_option(cli_node, tmp_path, args, env, named):
    """Outside a pod: one line and exit 64, no END (the run never began), and the restart guard counts it."""
    proc = run_podguard(cli_node, ["run", *args, "--", sys.executable, "-c", "pass"], env=env, cpu=True)
    assert proc.returncode == 64, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("podguard: error: ") and named in line
    runs = _history(tmp_path / "state")
    assert [(r.get("exit_code"), r.get("root_cause")) for r in runs] == [(64, "configuration")], runs


def test_inside_a_pod_the_refusal_says_end_once(cli_node):
    proc = run_podguard(
        cli_node,
        ["run", "--", sys.executable, "-c", "pass"],
        env={"PODGUARD_SELF_HEAL": "sometimes", "RUNPOD_POD_ID": "p1"},
        cpu=True,
    )
    assert proc.returncode == 64, proc.stderr
    ends = [line for line in proc.stderr.splitlines() if ": END " in line]
    assert len(ends) == 1 and ends[0].startswith("podguard run: END preflight exit 64 after 0 attempt(s): ")

"""Shared pytest fixtures. Each owner keeps their fixtures in one delimited block."""

from __future__ import annotations

# ======================================================================================================
# Fake NVML fixtures (owner: tests/fakenvml). Keep this block together.
#
#   fake_nvml      session: the fake libnvidia-ml.so.1 built with gcc from NVML's real header (cached)
#   fake_nvml_old  session: the "old driver" variant (newer symbols missing -> FunctionNotFound)
#   nvml_node      function: a fake 8xH100 node in tmp_path, environment set for this process and for
#                  subprocesses (node.env); see tests/fakenvml/node.py for its API.
# ======================================================================================================
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakenvml import FakeNvmlBuild, NvmlNode, build_fake_nvml, healthy_h100

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A persistent cache (FAKE_NVML_BUILD_DIR, else build/fakenvml in the repo) so the compile happens
    once per source change, not once per session; a temporary dir if the repo is read-only."""
    configured = os.environ.get("FAKE_NVML_BUILD_DIR")
    candidate = Path(configured) if configured else _REPO_ROOT / "build" / "fakenvml"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        if os.access(candidate, os.W_OK):
            return candidate
    except OSError:
        pass
    return tmp_path_factory.mktemp("fakenvml-build")


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> FakeNvmlBuild:
    """The fake NVML library (current driver). `.lib_dir` for LD_LIBRARY_PATH, `.library` for ctypes."""
    return FakeNvmlBuild(build_fake_nvml(_build_dir(tmp_path_factory), "current"), "current")


@pytest.fixture(scope="session")
def fake_nvml_old(tmp_path_factory: pytest.TempPathFactory) -> FakeNvmlBuild:
    """The fake as an old driver: no *_v2 memory / CUDA version, no _v3 process lists, no MIG, no remapped
    rows, no clock *event* reasons. Use it in a subprocess (one NVML library per process)."""
    return FakeNvmlBuild(build_fake_nvml(_build_dir(tmp_path_factory), "old"), "old")


@pytest.fixture
def nvml_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_nvml: FakeNvmlBuild) -> Iterator[NvmlNode]:
    """A healthy 8xH100 fake node. Change it with `nvml_node.write(scenario)`.

    Sets LD_LIBRARY_PATH, FAKE_NVML_SCENARIO, FAKE_NVML_PROCS_DIR, PODGUARD_DEV_DIR and (for this process
    only) PODGUARD_NVML_LIBRARY; `nvml_node.env` is the environment for subprocesses. Holders started with
    `nvml_node.spawn_holder(...)` and backends from `nvml_node.backend()` are cleaned up afterwards."""
    node = NvmlNode(root=tmp_path / "node", lib_dir=fake_nvml.lib_dir, scenario=healthy_h100())
    for key, value in node.env_vars().items():
        monkeypatch.setenv(key, value)
    node.write()
    try:
        yield node
    finally:
        node.teardown()


# ======================================================================================================
# End of fake NVML fixtures.
# ======================================================================================================


# ----------------------------------------------------------------------------------------------------
# shared by the CLI end-to-end tests and the process tests
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def cli_node(nvml_node, tmp_path, monkeypatch):
    """The fake 8-GPU node for `podguard` subprocesses: a private state dir, no inherited GPU selection,
    and no CUDA probe (these machines have no CUDA; probe tests turn it on explicitly)."""
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    for var in ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PODGUARD_PROBE", "off")
    return nvml_node


@pytest.fixture
def spawner(tmp_path):
    """Real helper processes for the procs/holders/cleanup tests, all stopped at teardown."""
    from procspawn import Spawner

    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        s.close()


# ----------------------------------------------------------------------------------------------------
# a suite that holds on a busy machine, however it was started (docs/testing.md, "On a busy machine")
# ----------------------------------------------------------------------------------------------------

# Signals a shell or nohup leaves ignored for what it starts (`make test &` in a script: SIGINT and SIGQUIT;
# `nohup make test`: SIGHUP). An ignored signal stays ignored across exec, so every podguard and job the tests
# start would ignore it too and a test that sends it would wait for an exit that never comes.
_INHERITED_IGNORES = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

# The tests that wait on real time (processes, signals, sockets, deadlines): `-m timing` picks them, and
# `make test-load` runs them with CPU hogs beside them. A test elsewhere opts in with @pytest.mark.timing.
TIMING_PATHS = (
    "launch/",
    "job/",
    "preflight/cleanup/",
    "pods/test_pods_clusters.py",
    "checkpoints/test_hf_trainer.py",
    "frameworks/",
)


def _not_ignored(signum: int, frame: object) -> None:
    """Stands in for SIG_IGN in the pytest process: pytest still shrugs the signal off, as its starter asked,
    but a handled signal is reset to its default at exec, so the processes the tests start get the default."""


def pytest_configure(config: pytest.Config) -> None:
    for signum in _INHERITED_IGNORES:
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, _not_ignored)
    # (a blocked signal, too, is inherited: unblocked here, in the thread that starts the tests' processes)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _INHERITED_IGNORES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            where = item.path.resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            continue
        if where.startswith(TIMING_PATHS):
            item.add_marker(pytest.mark.timing)

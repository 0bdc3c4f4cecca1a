"""Shared pieces of the pod tests: the stand-in API fixture, fast timings, and `podguard` as a subprocess.

    from pods_support import KEY, api_env, pg, standin, write_spec  # noqa: F401 (fixtures by import)

The fixture points RUNPOD_API_BASE_URL at a fresh stand-in, sets a test key, moves HOME to a temporary
folder (no ~/.runpod/config.toml leaks in) and shortens every poll/backoff so no test sleeps for seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_api import StandIn

KEY = "rpa_TESTKEY0123456789abcdefghijklmnopqrstuvwxyz"
FAST = {
    "PODGUARD_POD_POLL_S": "0.05",
    "PODGUARD_POD_SETTLE_S": "0.1",
    "PODGUARD_API_BACKOFF_S": "0.01",
    "PODGUARD_API_BACKOFF_CAP_S": "0.05",
    "PODGUARD_API_TIMEOUT_S": "5",
    "PODGUARD_POD_LOGS_IDLE_S": "0.3",
    "PODGUARD_SELF_HEAL_RESTART_WAIT_S": "0.3",
    "PODGUARD_POD_RESTART_CONFIRM_S": "1",
    "PODGUARD_KEEP_LAND_S": "1",  # a create in flight lands within its answer's 5 s and 1 s more (stand-in)
}
PODGUARD = [sys.executable, "-m", "podguard"]
SPAWNED: list[subprocess.Popen[str]] = []  # background processes a test started: ended when its stand-in closes


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    api = StandIn(KEY).start()
    api.world.set_capacity("NVIDIA A40", 16)
    api.world.set_capacity("NVIDIA A100 80GB PCIe", 16)
    home = tmp_path / "home"
    home.mkdir()
    for k, v in api_env(api, home, tmp_path / "state").items():
        monkeypatch.setenv(k, v)
    for var in ("RUNPOD_POD_ID", "PODGUARD_SELF_HEAL", "PODGUARD_JSON", "PODGUARD_API", "PODGUARD_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    try:
        yield api
    finally:
        for proc in SPAWNED:  # a test that failed half-way leaves no keeper running into the next one
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        SPAWNED.clear()
        api.close()


def api_env(api: StandIn, home: Path, state: Path) -> dict[str, str]:
    return {
        "RUNPOD_API_BASE_URL": api.url,
        "RUNPOD_API_KEY": KEY,
        "HOME": str(home),
        "PODGUARD_STATE_DIR": str(state),
        "PODGUARD_KEEPERS_DIR": str(state.parent / "keepers"),  # machine-wide in real life; one per test here
        **FAST,
    }


def pg(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`podguard ARGS` as a user runs it (the current environment plus `env`)."""
    return subprocess.run(
        [*PODGUARD, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def write_spec(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


A40_SPEC = """
    name = "trainer"
    image = "registry.example/me/podguard:0.2"
    args = "train -- python train.py"
    ports = ["22/tcp", "8888/http"]

    [gpu]
    types = ["NVIDIA A40", "NVIDIA A100 80GB PCIe"]
    count = 2

    [env]
    WANDB_PROJECT = "demo"

    [ready]
    timeout_s = 30
"""

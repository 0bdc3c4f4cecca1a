"""Fixtures the pod tests share: the kept pod's spec with a network volume (`spec`) and without (`bare_spec`).
A test module that needs another `spec` defines its own (tests/pods/test_pods_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from keep_support import NETWORK
from pods_support import A40_SPEC, write_spec


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    return write_spec(tmp_path / "pod.toml", NETWORK)


@pytest.fixture
def bare_spec(tmp_path: Path) -> Path:
    return write_spec(tmp_path / "bare.toml", A40_SPEC)

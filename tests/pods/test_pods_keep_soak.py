"""The seeded soak of `pod keep` (bench/bench_keep_soak.py), short: every invariant holds through late creates,
unknown statuses, a stranger, `pod down` at a random moment, keeper SIGKILLs, another machine's keep, a twin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_keep_soak import POLL_S, invariants_hold, soak  # noqa: E402

MUST = ("late", "odd", "down", "kill", "heal", "elsewhere", "second", "error", "maintenance")


@pytest.mark.slow
def test_a_short_seeded_soak_keeps_every_invariant(tmp_path):
    result = soak(seed=29, events=45, max_s=120, twin_s=3 * POLL_S, work=tmp_path, after_down_s=3.0, must=MUST)
    shown = json.dumps(result, indent=2)
    assert invariants_hold(result), shown
    assert result["downs"] >= 1 and result["by_kind"]["late"] >= 1 and result["keeper_kills"] >= 1, shown

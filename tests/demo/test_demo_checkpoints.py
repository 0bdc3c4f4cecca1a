"""The demo job with `--checkpoints` (demo/checkpoint.py): under `podguard train` with 2 gloo ranks it saves on
the save signal before `--max-runtime` ends it, and the next run resumes from that step."""

from __future__ import annotations

import re
import sys

import pytest

from jobproc import run_podguard

pytestmark = pytest.mark.slow

DEMO = [sys.executable, "-m", "podguard.demo", "--preset", "ci", "--save-every", "0", "--log-every", "1000"]


def test_the_demo_saves_on_the_signal_and_the_next_run_goes_on_from_there(cli_node, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["train", "--mode", "per-gpu", "--cpu-workers", "2", "--checkpoints", str(ckpt)]
    first = run_podguard(
        cli_node,
        [*args, "--save-signal", "USR1", "--max-runtime", "5s", "--", *DEMO, "--steps", "1000000"],
        cpu=True,
    )
    text = first.stdout + first.stderr
    assert first.returncode == 124, text[-4000:]
    saved = re.search(rf"saved checkpoint {re.escape(str(ckpt))}/step-(\d+)\.pt \(step (\d+)\)", text)
    assert saved is not None, text[-4000:]
    step = int(saved.group(1))
    assert [p.name for p in ckpt.iterdir()] == [f"step-{step}.pt"]  # no half file left behind
    again = run_podguard(cli_node, [*args, "--", *DEMO, "--steps", str(step + 5)], cpu=True)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-4000:]
    assert f"podguard: resuming from {ckpt / f'step-{step}.pt'} (step {step}, written " in text
    assert f"[demo] resumed from {ckpt / f'step-{step}.pt'} at step {step}" in text
    assert f"DONE steps={step + 5}" in text
    assert "final_loss=nan" not in text  # 5 steps ran here: their loss, and their rate (not the resumed steps')
    rate = int(re.search(r"samples/s=([\d,]+)", text).group(1).replace(",", ""))
    assert 0 < rate < 10_000_000

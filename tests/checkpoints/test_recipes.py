"""Every recipe in docs/checkpoints.md, run exactly as printed (the code blocks are read from the page), under
`podguard run --checkpoints DIR --restarts 1`: killed after step 130 (recipe_harness.py), the relaunch resumes
from the checkpoint of step 100 that podguard hands over, and at step 160 the weights and the optimizer state are
bit-identical to an uninterrupted run's. A recipe that restores no optimizer state (DCP's `dcp.load` into a fresh
optimizer's empty `state_dict()`) fails that comparison."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobproc import PODGUARD

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
HARNESS = Path(__file__).resolve().parent / "recipe_harness.py"
CRASH_AT, STOP_AT = 130, 160

# recipe -> (the import it needs, the checkpoint of step 100 it writes)
RECIPES = {
    "train_hf.py": ("transformers", "checkpoint-100"),
    "train_lightning.py": ("lightning", "epoch=1-step=100.ckpt"),
    "train_accelerate.py": ("accelerate", "step-100"),
    "train_dcp.py": ("torch.distributed.checkpoint", "step_100"),
    "train_torch.py": ("torch", "step-100.pt"),
}


def recipes() -> dict[str, str]:
    """Each ```python block of the page, by the file name its first line gives (`# train_dcp.py`)."""
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)
    out = {}
    for block in blocks:
        first = block.splitlines()[0]
        assert re.fullmatch(r"# \w+\.py", first), f"a python block of {DOC.name} without its file name: {first!r}"
        out[first[2:]] = block
    return out


def test_every_python_block_of_the_page_is_a_recipe_this_test_runs():
    assert sorted(recipes()) == sorted(RECIPES)


def run(node, tmp_path: Path, name: str, ckpt: Path, crash_at: int) -> str:
    """`podguard run --checkpoints CKPT --restarts 1 -- python harness CRASH_AT STOP_AT recipe` (its output)."""
    recipe = tmp_path / name
    recipe.write_text(recipes()[name])
    env = {**node.env, "LD_LIBRARY_PATH": ""}  # (no driver: the workers run on CPU)
    args = ["run", "--checkpoints", str(ckpt), "--restarts", "1", "--"]
    cmd = [*PODGUARD, *args, sys.executable, str(HARNESS), str(crash_at), str(STOP_AT), str(recipe)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def digest(out: str) -> str:
    # (not anchored at the line's start: a progress bar's last `\r` frame may come before it)
    (found,) = re.findall(rf"harness: step {STOP_AT} sha256 ([0-9a-f]{{64}})$", out, re.MULTILINE)
    return found


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_recipe_resumes_bit_identically_after_a_crash(cli_node, tmp_path, name):
    module, step_100 = RECIPES[name]
    pytest.importorskip(module)
    ckpt = tmp_path / "ckpt"
    crashed = run(cli_node, tmp_path, name, ckpt, CRASH_AT)
    assert f"harness: crash after step {CRASH_AT}" in crashed, crashed[-4000:]
    assert f"podguard: resuming from {ckpt / step_100} (step 100, written " in crashed, crashed[-4000:]
    assert "RESTART 1 of 1" in crashed
    whole = run(cli_node, tmp_path, name, tmp_path / "uninterrupted", 0)
    assert "harness: crash" not in whole and "resuming from" not in whole
    assert digest(crashed) == digest(whole)
    assert not any(p.name.startswith(".") for p in ckpt.iterdir())  # (no temporary file left behind)


def test_the_old_dcp_recipe_restored_no_optimizer_state_and_the_comparison_catches_it(cli_node, tmp_path):
    """The recipe this page printed before: `dcp.load` into `optim.state_dict()` of a fresh optimizer."""
    old = recipes()["train_dcp.py"]
    new_load = re.search(
        r"    model_state, optim_state = get_state_dict\(model, optim\)\n.*?set_state_dict\(.*?\)\n", old, re.S
    )
    assert new_load is not None
    old = old.replace(
        new_load.group(0),
        '    state = {"model": model.state_dict(), "optim": optim.state_dict()}\n'
        "    dcp.load(state, checkpoint_id=path)\n"
        '    model.load_state_dict(state["model"])\n'
        '    optim.load_state_dict(state["optim"])\n',
    )
    doc = tmp_path / "doc"
    doc.mkdir()
    (doc / "train_dcp.py").write_text(old)
    env = {**cli_node.env, "LD_LIBRARY_PATH": ""}
    outs = []
    for crash_at, ckpt in ((CRASH_AT, "ckpt"), (0, "uninterrupted")):
        cmd = [*PODGUARD, "run", "--checkpoints", str(tmp_path / ckpt), "--restarts", "1", "--", sys.executable]
        cmd += [str(HARNESS), str(crash_at), str(STOP_AT), str(doc / "train_dcp.py")]
        proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        outs.append(out)
    assert f"podguard: resuming from {tmp_path / 'ckpt' / 'step_100'} (step 100, written " in outs[0]
    assert digest(outs[0]) != digest(outs[1])  # the weights went on, the optimizer's moments started over

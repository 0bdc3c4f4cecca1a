"""Shapes users have, each once judged wrong (issue 31), written by the real libraries: a DCP folder named `latest/`,
a step-less `ema.pt` written after the newest checkpoint, accelerate's automatic `checkpoint_<i>` (a save count),
and an HF `checkpoint-<N>/` killed after its `config.json`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import writers as w

from podguard.checkpoints import Layout, find_checkpoints, resume_env, resume_lines


@pytest.mark.parametrize("name", ["latest", "final", "best"])
def test_a_dcp_folder_named_latest_final_or_best_is_judged_by_its_layout(tmp_path, name):
    """Rolling DCP saves into `latest/` (with a COMPLETED marker): `latest` is DeepSpeed's tracker only as a file."""
    folder = w.dcp_folder(tmp_path / name)
    (folder / "COMPLETED").write_text("")
    f = find_checkpoints(tmp_path)
    assert [(c.name, c.layout, c.whole) for c in f.checkpoints] == [(name, Layout.DCP, True)]
    assert resume_env(f) == {"PODGUARD_RESUME_FROM": str(folder)}


def test_a_dcp_latest_folder_without_its_marker_is_still_judged_by_its_dcp_metadata(tmp_path):
    folder = w.dcp_folder(tmp_path / "latest")
    assert find_checkpoints(tmp_path).chosen is not None
    (folder / ".metadata").unlink()
    (c,) = find_checkpoints(tmp_path).checkpoints
    assert (c.name, c.whole) == ("latest", False) and c.why.startswith("no .metadata")


def test_a_deepspeed_latest_file_beside_a_latest_folder_is_still_the_tracker(tmp_path):
    """`latest` the file names the tag; a user's folder of another name is judged on its own."""
    w.deepspeed_checkpoint(tmp_path, 100)
    f = find_checkpoints(tmp_path)
    assert f.chosen is not None and (f.chosen.name, f.chosen.layout) == ("global_step100", Layout.DEEPSPEED)
    assert [c.name for c in f.checkpoints] == ["global_step100"]  # (the tracker itself is no checkpoint)


@pytest.mark.parametrize("stepless", ["ema.pt", "best.pt", "model.safetensors"])
def test_a_stepless_file_written_after_the_newest_checkpoint_does_not_outrank_it(tmp_path, stepless):
    """A callback's weights-only `ema.pt` written after `epoch=0-step=20.ckpt` is no resume point: Lightning's
    resume from it fails (`KeyError: 'pytorch-lightning_version'`) on every relaunch."""
    w.torch_file(tmp_path / "epoch=0-step=10.ckpt")
    w.torch_file(tmp_path / "epoch=0-step=20.ckpt")
    w.age(tmp_path / "epoch=0-step=10.ckpt", 200)
    w.age(tmp_path / "epoch=0-step=20.ckpt", 100)
    if stepless.endswith(".safetensors"):
        w.safetensors_file(tmp_path / stepless)
    else:
        w.torch_file(tmp_path / stepless)
    f = find_checkpoints(tmp_path)
    assert [c.name for c in f.checkpoints] == ["epoch=0-step=20.ckpt", "epoch=0-step=10.ckpt", stepless]
    assert f.chosen is not None and f.chosen.name == "epoch=0-step=20.ckpt"
    assert resume_env(f)["PODGUARD_RESUME_STEP"] == "20"


def test_a_stepless_checkpoint_is_chosen_only_when_none_with_a_step_is_whole(tmp_path):
    w.torch_file(tmp_path / "model.pt")
    w.age(tmp_path / "model.pt", 100)
    assert find_checkpoints(tmp_path).chosen.name == "model.pt"  # the only one: it is the resume point
    w.truncate(w.torch_file(tmp_path / "step-5.pt"), 0.5)
    f = find_checkpoints(tmp_path)
    assert [c.name for c in f.skipped] == ["step-5.pt"] and f.chosen.name == "model.pt"
    lines = resume_lines(f, now=0.0)
    assert lines[0] == "skipping step-5.pt: its zip central directory does not read (cut short?)"


def test_two_stepless_checkpoints_rank_by_their_mtime(tmp_path):
    w.torch_file(tmp_path / "a.pt")
    w.torch_file(tmp_path / "b.pt")
    w.age(tmp_path / "b.pt", 100)
    assert [c.name for c in find_checkpoints(tmp_path).checkpoints] == ["a.pt", "b.pt"]


ACCELERATE_AUTOMATIC = """
import sys, torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

acc = Accelerator(cpu=True, project_dir=sys.argv[1],
                  project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
for update in range(1, 22):
    with acc.accumulate(model):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    if update in (10, 21):
        acc.save_state()  # checkpoints/checkpoint_0 after 10 updates, checkpoint_1 after 21
"""


def test_accelerates_automatic_checkpoint_i_counts_saves_not_steps(tmp_path):
    """`checkpoint_1` is accelerate's second save (ProjectConfiguration.iteration), here after 21 optimizer
    updates: handing it over as step 1 made `resume_step() + 1` restart the loop at step 2."""
    pytest.importorskip("accelerate")
    script = tmp_path / "auto.py"
    script.write_text(textwrap.dedent(ACCELERATE_AUTOMATIC))
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, capture_output=True, timeout=300)
    ckpt = tmp_path / "checkpoints"
    assert sorted(os.listdir(ckpt)) == ["checkpoint_0", "checkpoint_1"]
    f = find_checkpoints(ckpt)
    assert [(c.name, c.layout, c.step, c.whole) for c in f.checkpoints] == [
        ("checkpoint_1", Layout.ACCELERATE, None, True),
        ("checkpoint_0", Layout.ACCELERATE, None, True),
    ]
    assert resume_env(f) == {"PODGUARD_RESUME_FROM": str(ckpt / "checkpoint_1")}  # no PODGUARD_RESUME_STEP


def test_accelerate_state_in_a_step_named_folder_keeps_the_step_of_its_name(tmp_path):
    pytest.importorskip("accelerate")
    w.accelerate_state(tmp_path / "step_21")
    (c,) = find_checkpoints(tmp_path).checkpoints
    assert (c.layout, c.step, c.whole) == (Layout.ACCELERATE, 21, True)


def test_an_hf_checkpoint_killed_after_its_config_json_is_named_as_skipped(tmp_path):
    """The Trainer writes config.json first (save_model) and trainer_state.json last: a folder with only
    config.json is a save that did not finish, and the line before the attempt says so."""
    w.hf_checkpoint(tmp_path, 500)
    w.age(tmp_path / "checkpoint-500", 600)
    (tmp_path / "checkpoint-600").mkdir()
    (tmp_path / "checkpoint-600" / "config.json").write_text('{"model_type": "gpt2"}')
    f = find_checkpoints(tmp_path)
    assert [(c.name, c.layout, c.whole) for c in f.checkpoints] == [
        ("checkpoint-600", Layout.HF, False),
        ("checkpoint-500", Layout.HF, True),
    ]
    why = "only config.json in it: the save did not finish (no weights, no trainer_state.json)"
    assert f.skipped[0].why == why
    assert resume_lines(f, now=0.0)[0] == f"skipping checkpoint-600: {why}"


def test_an_empty_hf_checkpoint_folder_is_named_as_skipped(tmp_path):
    w.hf_checkpoint(tmp_path, 500)
    w.age(tmp_path / "checkpoint-500", 600)
    (tmp_path / "checkpoint-600").mkdir()
    f = find_checkpoints(tmp_path)
    assert f.skipped[0].why == "empty: the save did not finish"
    assert f.chosen is not None and f.chosen.name == "checkpoint-500"


def _hf_half(folder: Path) -> None:
    """What save_model leaves before the optimizer: config.json, generation_config.json, the weights."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "generation_config.json").write_text("{}")
    w.safetensors_file(folder / "model.safetensors")


def test_an_hf_checkpoint_killed_after_its_weights_names_the_missing_trainer_state(tmp_path):
    w.hf_checkpoint(tmp_path, 500)
    w.age(tmp_path / "checkpoint-500", 600)
    _hf_half(tmp_path / "checkpoint-600")
    f = find_checkpoints(tmp_path)
    assert f.skipped[0].why == "no trainer_state.json (the Trainer writes it last: the save did not finish)"


HF_KILLED_IN_SAVE = """
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import transformers.modeling_utils as modeling_utils
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging

logging.set_verbosity_error()
real, saves = modeling_utils.safe_save_file, []


def save_file(*args, **kwargs):  # the second save dies as it starts writing the weights (a kill, an OOM)
    saves.append(1)
    if len(saves) == 2:
        os._exit(9)
    return real(*args, **kwargs)


modeling_utils.safe_save_file = save_file  # (save_pretrained writes the weights with it)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16))
ids = torch.randint(0, 32, (64, 8))
args = TrainingArguments(output_dir=sys.argv[1], max_steps=4, save_steps=2, per_device_train_batch_size=4,
                         report_to="none", use_cpu=True, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids]).train()
"""


def test_a_real_hf_trainer_killed_in_its_save_leaves_a_folder_that_is_named_as_skipped(tmp_path):
    pytest.importorskip("transformers")
    script = tmp_path / "killed.py"
    script.write_text(HF_KILLED_IN_SAVE)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert sorted(os.listdir(out / "checkpoint-4")) == ["config.json", "generation_config.json"]
    f = find_checkpoints(out)
    assert [(c.name, c.whole) for c in f.checkpoints] == [("checkpoint-4", False), ("checkpoint-2", True)]
    assert resume_lines(f, now=0.0)[0] == (
        "skipping checkpoint-4: only config.json, generation_config.json in it: the save did not finish "
        "(no weights, no trainer_state.json)"
    )
    assert resume_env(f)["PODGUARD_RESUME_FROM"] == str(out / "checkpoint-2")

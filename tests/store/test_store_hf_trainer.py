"""A real Hugging Face Trainer (a tiny GPT-2 built from a config, no hub download) killed on one pod and resumed on
another (an empty DIR) from the checkpoint store: its losses and weights go on bit for bit as in a run that was
never interrupted."""

from __future__ import annotations

import re
import sys

import pytest
from s3server import store_env

from jobproc import run_podguard, script

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

HF_JOB = """
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging

from podguard.integrations.hf import PodguardCallback
from podguard.rank import resume_from

logging.set_verbosity_error()
out, max_steps, crash_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.tensor([(i * 7 + j * 3) % 32 for j in range(8)])
        return {"input_ids": ids, "labels": ids}


class Report(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"loss {state.global_step} {logs['loss']!r}", flush=True)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
        print(f"weights {state.global_step} {flat.sum().item()!r} {flat.abs().sum().item()!r}", flush=True)
        if state.global_step == crash_at:
            os._exit(3)  # the host dies after the save at step 5


args = TrainingArguments(
    output_dir=out, max_steps=max_steps, save_steps=5, per_device_train_batch_size=4, report_to=[], use_cpu=True,
    logging_strategy="steps", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, seed=0,
)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[PodguardCallback(), Report()])
print(f"resume from {resume_from()}", flush=True)
trainer.train(resume_from_checkpoint=resume_from())
print(f"done at step {trainer.state.global_step}", flush=True)
"""


def trace(text: str) -> dict[int, tuple[str, ...]]:
    out: dict[int, tuple[str, ...]] = {}
    for kind, step, rest in re.findall(r"^(loss|weights) (\d+) (.+)$", text, re.MULTILINE):
        out[int(step)] = (*out.get(int(step), ()), f"{kind} {rest}")
    return out


def test_a_trainer_killed_on_one_pod_goes_on_bit_for_bit_on_another_from_the_store(cli_node, tmp_path, s3):
    server, bucket = s3
    url = f"s3://{bucket}/hf"
    job = script(tmp_path, "hf_job.py", HF_JOB)
    env = store_env(server.url)

    def run(out, crash_at, store=True):
        args = ["run", "--checkpoints", str(out)] + (["--checkpoint-store", url] if store else [])
        proc = run_podguard(
            cli_node, [*args, "--", sys.executable, job, str(out), "10", str(crash_at)], env=env, cpu=True, timeout=300
        )
        return proc, proc.stdout + proc.stderr

    proc, straight = run(tmp_path / "straight", -1, store=False)  # never interrupted
    assert proc.returncode == 0, straight[-3000:]
    proc, first = run(tmp_path / "pod1", 7)  # pod 1: saves at step 5, dies at step 7
    assert proc.returncode == 3, first[-3000:]
    assert f"stored checkpoint-5 in {url}" in first, first[-3000:]
    assert "END failed exit 3" in first and "stored checkpoint-5 (step 5, written " in first

    proc, second = run(tmp_path / "pod2", -1)  # pod 2: another DIR, empty; the same store
    assert proc.returncode == 0, second[-3000:]
    assert f"podguard: restored checkpoint-5 (step 5) from {url}: " in second, second[-3000:]
    assert f"resume from {tmp_path / 'pod2' / 'checkpoint-5'}" in second
    want, got = trace(straight), trace(second)
    assert sorted(got) == [6, 7, 8, 9, 10], second[-3000:]
    for step in range(6, 11):
        assert got[step] == want[step], (step, got[step], want[step])  # losses and weights, bit for bit
    assert trace(first)[5] == want[5]
    assert "done at step 10" in second

"""A real framework end to end: a tiny Hugging Face Trainer (a GPT-2 built from a config, no hub download) under
`podguard run --checkpoints`: crashed once and resumed by `--restarts 1` through PODGUARD_RESUME_FROM with its
step counter continuing; and saved on `--save-signal` by podguard's callback before `--max-runtime` ends it."""

from __future__ import annotations

import re
import sys

import pytest

from jobproc import run_podguard, script

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

HF_JOB = """
import os, signal, sys, time, warnings
# A save request that comes before the callback's handler exists would kill the job (SIGUSR1's default action):
# on a busy machine the imports below can outlast --max-runtime. Blocked, it waits for the handler instead.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
warnings.filterwarnings("ignore")
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging

from podguard.integrations.hf import PodguardCallback
from podguard.rank import resume_from

logging.set_verbosity_error()
out, max_steps, crash_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
step_s, save_steps = float(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.tensor([(i + j) % 32 for j in range(8)])
        return {"input_ids": ids, "labels": ids}


class Report(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"step {state.global_step}", flush=True)
        time.sleep(step_s)
        if os.environ.get("PODGUARD_RESTART_COUNT") == "0" and state.global_step == crash_at:
            os._exit(3)  # a crash after the save at step 5


args = TrainingArguments(
    output_dir=out, max_steps=max_steps, save_steps=save_steps, per_device_train_batch_size=4, report_to=[],
    use_cpu=True, logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[PodguardCallback(), Report()])
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # the handler is in place: an early request lands
print(f"resume from {resume_from()}", flush=True)
trainer.train(resume_from_checkpoint=resume_from())
print(f"done at step {trainer.state.global_step}", flush=True)
"""


def steps(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^step (\d+)$", text, re.MULTILINE)]


def test_a_crashed_trainer_resumes_from_its_last_checkpoint_and_its_step_counter_continues(cli_node, tmp_path):
    out = tmp_path / "out"
    job = script(tmp_path, "hf_job.py", HF_JOB)
    args = [
        "run",
        "--checkpoints",
        str(out),
        "--restarts",
        "1",
        "--",
        sys.executable,
        job,
        str(out),
        "10",
        "7",
        "0",
        "5",
    ]
    proc = run_podguard(cli_node, args, cpu=True, timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "resume from None" in text and f"resume from {out / 'checkpoint-5'}" in text
    assert steps(text) == [1, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9, 10]  # the second attempt goes on from step 5
    assert "done at step 10" in text
    assert f"podguard: resuming from {out / 'checkpoint-5'} (step 5, written " in text


def test_the_callback_saves_on_the_save_signal_before_max_runtime_ends_the_trainer(cli_node, tmp_path):
    """On a busy machine the job may still be importing when --max-runtime comes: its save request then waits
    (blocked) for the callback, and the save grace is a deadline generous enough for a loaded machine (podguard
    ends the wait as soon as the checkpoint is whole)."""
    out = tmp_path / "out"
    job = script(tmp_path, "hf_job.py", HF_JOB)
    args = ["run", "--checkpoints", str(out), "--save-signal", "USR1", "--max-runtime", "8s", "--save-grace", "150s"]
    proc = run_podguard(
        cli_node,
        [*args, "--", sys.executable, job, str(out), "100000", "-1", "0.05", "100000"],
        cpu=True,
        timeout=300,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 124, text[-4000:]
    saved = re.search(rf"saved checkpoint {re.escape(str(out))}/checkpoint-(\d+) \(step (\d+)\)", text)
    assert saved is not None, text[-4000:]
    step = int(saved.group(1))
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [f"checkpoint-{step}"]
    assert (out / f"checkpoint-{step}" / "trainer_state.json").exists()  # (no periodic saves: only the signal's)
    assert steps(text)[-1] >= step

"""The shipped HF and Lightning callbacks announce their saves and evaluations (issue 30, item 1): real
transformers Trainer and Lightning on CPU, in one process, on a real heartbeat board. While the framework saves or
evaluates, the rank's busy slot holds ("saving", "evaluating"); between them it does not. End to end: a Lightning
job whose checkpoint save takes longer than --hang-timeout, silently, is not called hung with the callback."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from jobproc import run_podguard
from podguard.rank import busy as busy_module
from podguard.rank import progress as hb
from podguard.rank.progress import create_board, read_slots

pytestmark = pytest.mark.slow


def _announced(board: Path) -> str:
    """What the rank announces now: its busy slot's word while it holds, else ''."""
    got = read_slots(board)[1].get(0)
    return got.what if got is not None and got.holds(time.monotonic()) else ""


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = create_board(tmp_path / "hb", 2)
    monkeypatch.setenv(hb.ENV_FILE, str(path))
    monkeypatch.setenv(hb.ENV_SLOT, "0")  # (LOCAL_RANK would make the frameworks start a process group)
    hb._reset_for_tests()
    busy_module._depth = 0
    yield path
    hb._reset_for_tests()


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "accelerate")),
    reason="needs torch, transformers and accelerate",
)
def test_the_hf_callback_announces_evaluations_and_saves(tmp_path: Path, board: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import logging

    from podguard.integrations.hf import PodguardCallback

    logging.set_verbosity_error()
    seen: list[tuple[str, str]] = []

    class Data(torch.utils.data.Dataset):
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            if self.kind == "eval":
                seen.append(("eval", _announced(board)))
            ids = torch.arange(8) % 32
            return {"input_ids": ids, "labels": ids}

    class Watched(Trainer):
        def _save_checkpoint(self, *args, **kwargs):
            seen.append(("save", _announced(board)))
            return super()._save_checkpoint(*args, **kwargs)

        def training_step(self, *args, **kwargs):
            seen.append(("train", _announced(board)))
            return super().training_step(*args, **kwargs)

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, save_steps=3, eval_strategy="steps", eval_steps=2,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, report_to=[], use_cpu=True,
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Watched(
        model=GPT2LMHeadModel(config), args=args, train_dataset=Data("train"), eval_dataset=Data("eval"),
        callbacks=[PodguardCallback()],
    )  # fmt: skip
    trainer.train()
    assert {word for kind, word in seen if kind == "eval"} == {"evaluating"}
    assert [word for kind, word in seen if kind == "save"] == ["saving", "saving"]
    assert {word for kind, word in seen if kind == "train"} == {""}  # nothing announced between them
    assert _announced(board) == "" and read_slots(board)[0][0].step == 6


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "lightning")), reason="needs torch and lightning"
)
def test_the_lightning_callback_announces_validation_and_saves(tmp_path: Path, board: Path) -> None:
    import lightning as L
    import torch

    from podguard.integrations.lightning import PodguardCallback

    seen: list[tuple[str, str]] = []

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            seen.append(("train", _announced(board)))
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            seen.append(("eval", _announced(board)))

        def on_save_checkpoint(self, checkpoint):  # (after the callbacks' hook, before the file is written)
            seen.append(("save", _announced(board)))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=4)
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=6, val_check_interval=4, num_sanity_val_steps=0, callbacks=[PodguardCallback(), saver],
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), data, data)
    assert {word for kind, word in seen if kind == "eval"} == {"evaluating"}
    assert {word for kind, word in seen if kind == "save"} == {"saving"} and len(list((tmp_path / "ckpt").iterdir()))
    assert {word for kind, word in seen if kind == "train"} == {""}
    assert _announced(board) == ""


SLOW_SAVE = """
    import sys, threading, time, warnings
    started = threading.Event()
    def say_loading():  # start-up talks: a busy machine's slow imports are no hang
        while not started.wait(1.0):
            print("importing", flush=True)
    threading.Thread(target=say_loading, daemon=True).start()
    import lightning as L, torch
    from podguard.integrations.lightning import PodguardCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
        def training_step(self, batch, i):
            started.set()
            time.sleep(0.2)
            print(f"step {self.global_step}", flush=True)
            return self.layer(batch[0]).pow(2).mean()
        def on_save_checkpoint(self, checkpoint):
            time.sleep(SAVE_S)  # a save to a slow volume: silent, longer than --hang-timeout
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 4)), batch_size=4)
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=4)]
    if sys.argv[2] == "with":
        callbacks.insert(0, PodguardCallback())
    trainer = L.Trainer(max_steps=6, callbacks=callbacks, accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), data)
    print("done", flush=True)
    """


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "lightning")), reason="needs torch and lightning"
)
@pytest.mark.parametrize(("callback", "code"), [("with", 0), ("without", 79)])
def test_a_long_silent_save_under_the_lightning_callback_is_not_a_hang(tmp_path, cli_node, callback, code):
    job = tmp_path / "slow_save.py"
    job.write_text(textwrap.dedent(SLOW_SAVE).replace("SAVE_S", "20"))
    args = ["run", "--hang-timeout", "10", "--grace", "1", "--", sys.executable, str(job), str(tmp_path / "c")]
    proc = run_podguard(cli_node, [*args, callback], cpu=True, timeout=180)
    assert proc.returncode == code, (proc.stdout + proc.stderr)[-3000:]

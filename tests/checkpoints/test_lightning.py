"""podguard's Lightning callback with a tiny real Lightning module: it saves `step=<N>.ckpt` on the save signal
(a whole checkpoint for the finder), and `fit(ckpt_path=resume_from())` goes on from that step."""

from __future__ import annotations

import os
import signal
import warnings

import pytest

L = pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from podguard.checkpoints import find_checkpoints, resume_env  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SignalAt(L.Callback):
    """Sends the save signal to this process at one step (as podguard does before a guard ends the job)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


class Count(L.Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append(trainer.global_step)


def fit(tmp_path, steps, callbacks, ckpt_path=None):
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=callbacks,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), data, ckpt_path=ckpt_path)
    return trainer


def test_the_callback_saves_on_the_signal_and_the_fit_resumes_from_it(tmp_path, monkeypatch):
    from podguard.integrations.lightning import PodguardCallback
    from podguard.rank import resume_from

    ckpt = tmp_path / "ckpt"
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        callback = PodguardCallback(str(ckpt), save_signal=signal.SIGUSR1)
        fit(tmp_path, 6, [SignalAt(3), callback])
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert callback.saved == [str(ckpt / "step=4.ckpt")]  # saved at the end of the batch the signal came in
    finding = find_checkpoints(ckpt)
    assert finding.chosen is not None and finding.chosen.whole and finding.chosen.step == 4
    for key, value in resume_env(finding).items():
        monkeypatch.setenv(key, value)
    counted = Count()
    trainer = fit(tmp_path, 8, [counted], ckpt_path=resume_from())
    assert trainer.global_step == 8 and counted.steps == [5, 6, 7, 8]  # went on from step 4


@pytest.mark.parametrize("save_last", [True, "link"])
def test_lightnings_last_ckpt_gets_its_step_from_its_metadata(tmp_path, save_last):
    """ModelCheckpoint(save_last=True) copies the newest checkpoint to last.ckpt (no step in the name: the step
    comes from its data.pkl); save_last="link" makes it a symlink (listed once, as its target)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = tmp_path / "ckpt"
    every = ModelCheckpoint(dirpath=ckpt, every_n_train_steps=5, save_top_k=-1, save_last=save_last)
    trainer = fit(tmp_path, 12, [every])
    trainer.strategy.barrier()
    finding = find_checkpoints(ckpt)
    assert finding.chosen is not None and finding.chosen.step == 10
    assert resume_env(finding)["PODGUARD_RESUME_STEP"] == "10"
    names = [c.name for c in finding.checkpoints]
    assert names == (["last.ckpt"] if save_last is True else []) + ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt"]


class SaveEma(L.Callback):
    """A callback's weights-only file, written after the last ModelCheckpoint save (no step in its name)."""

    def __init__(self, path) -> None:
        self.path = path

    def on_train_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), self.path)


def test_a_weights_only_ema_pt_written_after_the_last_save_is_not_the_resume_point(tmp_path, monkeypatch):
    """Resuming Lightning from `ema.pt` fails (`KeyError: 'pytorch-lightning_version'`) on every relaunch: the
    newest checkpoint with a step, `epoch=0-step=10.ckpt`, is the one handed over, and the fit goes on from it."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from podguard.rank import resume_from

    ckpt = tmp_path / "ckpt"
    every = ModelCheckpoint(dirpath=ckpt, every_n_train_steps=5, save_top_k=-1)
    fit(tmp_path, 10, [every, SaveEma(ckpt / "ema.pt")])
    assert (ckpt / "ema.pt").stat().st_mtime >= (ckpt / "epoch=0-step=10.ckpt").stat().st_mtime
    finding = find_checkpoints(ckpt)
    assert [c.name for c in finding.checkpoints] == ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt", "ema.pt"]
    env = resume_env(finding)
    assert env == {"PODGUARD_RESUME_FROM": str(ckpt / "epoch=0-step=10.ckpt"), "PODGUARD_RESUME_STEP": "10"}
    with pytest.raises(KeyError, match="pytorch-lightning_version"):
        fit(tmp_path, 12, [], ckpt_path=str(ckpt / "ema.pt"))  # (what handing over ema.pt did)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    counted = Count()
    trainer = fit(tmp_path, 12, [counted], ckpt_path=resume_from())
    assert trainer.global_step == 12 and counted.steps == [11, 12]

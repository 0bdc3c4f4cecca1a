"""A tiny Lightning job on CPU (random data): `python lightning_job.py MODE DEVICES STEP_S`.

MODE: healthy (every step), hang (rank 1's data never comes at step 3: `load_shard`), crash (rank 1 raises at
step 3; rank 0 then fails on the closed connection). Lightning's default progress bar, which is RichProgressBar
wherever rich is installed: on a pipe it draws nothing until the end unless the output says it takes redraws.
"""

import sys
import threading
import time

# The hang clock runs from launch: start-up keeps talking until the imports are done (on a busy machine importing
# torch and lightning takes longer than the tests' --hang-timeout).
imported = threading.Event()


def say_importing() -> None:
    print("importing torch and lightning", flush=True)
    while not imported.wait(1.0):
        print("importing torch and lightning", flush=True)


threading.Thread(target=say_importing, daemon=True).start()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

imported.set()

MODE, DEVICES, STEP_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
STEPS = 40


def load_shard(step: int) -> None:
    """Rank 1's read that never returns: the stuck function the hang evidence must show."""
    time.sleep(3600)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def training_step(self, batch, i):
        x, y = batch
        if self.global_rank == 1 and i == 3:
            if MODE == "hang":
                load_shard(i)
            if MODE == "crash":
                raise ValueError(f"rank 1: bad batch at step {i}")
        time.sleep(STEP_S)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = DataLoader(
    TensorDataset(torch.randn(2 * STEPS * DEVICES, 16), torch.randn(2 * STEPS * DEVICES, 1)), batch_size=2
)
trainer = L.Trainer(
    max_epochs=1,
    accelerator="cpu",
    devices=DEVICES,
    strategy="ddp" if DEVICES > 1 else "auto",
    logger=False,
    enable_checkpointing=False,
    enable_model_summary=False,
)
trainer.fit(Tiny(), data)

"""The demo's synthetic dataset, generated deterministically and prepared once per node.

Labels come from a fixed random "teacher" network, so the task is learnable (the loss really goes
down) yet needs no download. Generation is a callable for `prepare_once`: its identity plus every
parameter below form the cache key, so changing any of them prepares a new dataset.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

DATA_FILE = "data.pt"
GENERATOR_VERSION = "teacher-mlp-v1"  # bump when the generation below changes


@dataclass(frozen=True)
class SyntheticDataset:
    samples: int
    input_dim: int
    classes: int
    seed: int

    def key_parts(self) -> dict[str, str | int]:
        return {"dataset": GENERATOR_VERSION, **asdict(self)}

    def __call__(self, out_dir: Path) -> None:
        """Write `data.pt` ({"x": float32 [samples, input_dim], "y": int64 [samples]}) into out_dir."""
        import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

        gen = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.samples, self.input_dim, generator=gen)
        teacher_hidden = 4 * self.input_dim
        w1 = torch.randn(self.input_dim, teacher_hidden, generator=gen) / self.input_dim**0.5
        w2 = torch.randn(teacher_hidden, self.classes, generator=gen) / teacher_hidden**0.5
        y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
        torch.save({"x": x, "y": y}, Path(out_dir) / DATA_FILE)
        (Path(out_dir) / "meta.json").write_text(json.dumps(self.key_parts(), indent=2) + "\n")


def load(directory: Path) -> tuple[object, object]:
    """(x, y) tensors from a prepared directory. weights_only: the file is data, never code."""
    import torch  # noqa: PLC0415  lazy: torch (the demo's extra), loaded by main() under the import lock

    data = torch.load(Path(directory) / DATA_FILE, weights_only=True)
    return data["x"], data["y"]

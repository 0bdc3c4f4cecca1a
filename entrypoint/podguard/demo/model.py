"""The demo model: a residual MLP (pre-norm blocks), stable at any depth so the "production" preset's
32 layers train as well as the "ci" preset's 2. Imported only after torch (under the import lock)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class DemoNet(nn.Module):
    def __init__(self, input_dim: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(input_dim, hidden)
        self.blocks = nn.Sequential(*(Block(hidden) for _ in range(layers)))
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.blocks(self.inp(x))))

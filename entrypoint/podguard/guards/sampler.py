"""The idle test: every watched GPU at or below 5 % utilisation, one cheap NVML call per GPU (no CUDA context).

    sampler = UtilizationSampler(backend, [0, 1])
    tracker = IdleTracker(limit_s=1800)
    tracker.update(sampler.sample(), time.monotonic())   # seconds idle so far (0 while any GPU works)

A GPU whose utilisation NVML cannot read (MIG mode, not supported, lost) counts as busy: the guard never
stops a node it cannot see idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from podguard.gpu.backend import GpuBackend
from podguard.guards.settings import IDLE_UTILIZATION_PCT

__all__ = ["IdleTracker", "UtilizationSampler", "is_idle"]


class UtilizationSampler:
    def __init__(self, backend: GpuBackend, indices: Sequence[int]) -> None:
        self.backend = backend
        self.indices = tuple(indices)

    def sample(self) -> tuple[int | None, ...]:
        """Each watched GPU's utilisation in percent (None: unknown)."""
        return tuple(self.backend.utilization(i) for i in self.indices)


def is_idle(sample: Sequence[int | None]) -> bool:
    return bool(sample) and all(u is not None and u <= IDLE_UTILIZATION_PCT for u in sample)


@dataclass
class IdleTracker:
    """How long every GPU has been idle: since the first idle sample of an unbroken run of idle samples."""

    idle_since: float | None = None
    last: tuple[int | None, ...] = ()

    def reset(self) -> None:
        self.idle_since = None

    def update(self, sample: tuple[int | None, ...], now: float) -> float:
        self.last = sample
        if not is_idle(sample):
            self.idle_since = None
            return 0.0
        if self.idle_since is None:
            self.idle_since = now
        return now - self.idle_since

"""Several watches on one supervisor (the billing guards and the run-time watch), started and closed in order.

sup = Supervisor(watch=WatchGroup([guards.supervised(), runtime]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podguard.launch.supervisor import Supervisor, Watch

__all__ = ["WatchGroup"]


class WatchGroup:
    def __init__(self, watches: Sequence[Watch | None]) -> None:
        self.watches = [w for w in watches if w is not None]

    def start(self, sup: Supervisor) -> None:
        for watch in self.watches:
            watch.start(sup)

    def cause_of_exit(self, worker_gpus: tuple[int, ...], code: int) -> tuple[int, str] | None:
        """The first watch that names a root cause for a worker's own failure (supervisor.Watch)."""
        for watch in self.watches:
            ask = getattr(watch, "cause_of_exit", None)
            if ask is not None and (cause := ask(worker_gpus, code)) is not None:
                return cause  # type: ignore[no-any-return]
        return None

    def close(self) -> None:
        """Close every watch; the first error is raised once all are closed."""
        error: BaseException | None = None
        for watch in self.watches:
            try:
                watch.close()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

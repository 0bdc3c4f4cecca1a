"""A target pinned for signalling: a pidfd where the kernel has them, else (pid, start time) checked
right before each `kill`, so a PID reused since the scan is never signalled.

    proc = PinnedProcess(target, round_no=1)
    proc.open()                      # outcome GONE when the planned process no longer exists
    proc.send(signal.SIGTERM)
    proc.close(); proc.record()      # -> KillRecord
"""

from __future__ import annotations

import os
import select
import signal
import time

from podguard import console
from podguard.preflight.cleanup.process_table import read_stat
from podguard.preflight.cleanup.vocabulary import KillRecord, Outcome, Target

__all__ = ["PinnedProcess"]


class PinnedProcess:
    """One target of a round: its pidfd (or None), the signals sent, when it exited, its final outcome."""

    def __init__(self, target: Target, round_no: int) -> None:
        self.target = target
        self.round = round_no
        self.pidfd: int | None = None
        self.signals: list[str] = []
        self.first_signal_at: float | None = None
        self.exited_at: float | None = None
        self.outcome: Outcome | None = None  # set once final
        self.state: str | None = None
        self.note = ""

    @property
    def pid(self) -> int:
        return self.target.pid

    @property
    def live(self) -> bool:
        return self.outcome is None and self.exited_at is None

    def open(self) -> None:
        st = read_stat(self.pid)
        if st is None or st.start_time != self.target.start_time:
            self.outcome = Outcome.GONE
            return
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.outcome = Outcome.GONE
            return
        except (OSError, AttributeError):  # no pidfd support: signal by pid after checking the start time
            if st.state in ("Z", "X"):
                self.outcome = Outcome.GONE
            return
        st = read_stat(self.pid)  # the pidfd pins the process; confirm it is still the one planned
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        # Readable = the whole thread group has exited (a "Z" leader with live threads is not gone).
        if st is None or st.start_time != self.target.start_time or poller.poll(0):
            os.close(fd)
            self.outcome = Outcome.GONE
            return
        self.pidfd = fd

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def has_exited(self) -> bool:
        """Non-blocking check; pidfd handles are normally settled by poll() instead."""
        st = read_stat(self.pid)
        return st is None or st.start_time != self.target.start_time or st.state in ("Z", "X")

    def mark_exited(self, now: float) -> None:
        if self.exited_at is None:
            self.exited_at = now

    def send(self, sig: signal.Signals, *, record: bool = True) -> bool:
        """Signal the pinned process; False when it has exited (or may not be signalled)."""
        if not self.live:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                if self.has_exited():
                    self.mark_exited(time.monotonic())
                    return False
                os.kill(self.pid, sig)
        except ProcessLookupError:
            self.mark_exited(time.monotonic())
            return False
        except PermissionError:
            self.outcome = Outcome.NOT_PERMITTED
            console.warn(f"not permitted to signal pid {self.pid} ({self.target.cmdline}): {sig.name}")
            return False
        if record:
            self.signals.append(sig.name)
            if self.first_signal_at is None:
                self.first_signal_at = time.monotonic()
        return True

    def record(self) -> KillRecord:
        t = self.target
        outcome = self.outcome
        if outcome is None:
            outcome = (
                Outcome.KILLED if "SIGKILL" in self.signals else (Outcome.TERMINATED if self.signals else Outcome.GONE)
            )
        exit_ms = None
        if self.exited_at is not None and self.first_signal_at is not None:
            exit_ms = max(0.0, (self.exited_at - self.first_signal_at) * 1000.0)
        return KillRecord(
            pid=t.pid,
            cmdline=t.cmdline,
            name=t.name,
            role=t.role,
            tree=t.tree,
            gpus=t.gpus,
            memory=dict(t.memory),
            reason=t.reason,
            round=self.round,
            outcome=outcome,
            signals=tuple(self.signals),
            exit_ms=exit_ms,
            state=self.state,
            parent=t.parent,
            note=self.note,
        )

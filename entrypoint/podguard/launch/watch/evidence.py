"""A hung job's evidence, kept on a helper thread, and the deadline that ends the job whatever that thread does.

    evidence = HangEvidence(evidence_dir, pids, worker_gpus, slot_gpus, flight=True, job_env=env)
    evidence.start(on_done=lambda lines: ...)     # the stacks, then torch's flight recorder; never raises
    evidence.lines()                              # what is known so far (also when the thread is still stuck)

The thread takes every rank's stacks (stacks.py), then asks torch's flight recorder for its dump (flight.py) and
writes `<evidence_dir>/hang.json`. Any of that can block: py-spy in a rank stuck in uninterruptible sleep in the
driver, a /proc read of such a process. So the run-time watch never waits for this thread: it ends the job at
`evidence_deadline_s` (runtime.py) with what is known by then, and the thread is a daemon, given up at the end.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from podguard.errors import DEFAULT_GRACE_S
from podguard.launch.watch.flight import trigger_flight_dump
from podguard.launch.watch.hangs import Hang
from podguard.launch.watch.stacks import capture_ranks, find_rank_processes, hang_summary

__all__ = ["HANG_END_S", "LOOP_WRITE_S", "HangEvidence", "evidence_deadline_s", "hang_grace_s", "write_json"]

HANG_END_S = 60.0  # a hung job is ended within --hang-timeout + this (docs/watch.md); PODGUARD_HANG_END_S: tests
LOOP_WRITE_S = 0.5  # a record written from the supervisor's loop: waited for at most this long
END_MARGIN_S = 8.0  # after the grace: leftovers (2 s), the pipes (0.5 s), the output (3 s), the watch's close


def evidence_deadline_s(end_s: float, tick_s: float, grace_s: float) -> float:
    """How long the evidence may take so that the job ends within `end_s` of the hang timeout: the tick that
    found it, the grace after SIGTERM and the supervisor's bounded end come after it. A --grace over the default
    counts as the default here (44 s for the evidence): the grace of a hung job is cut to what is left instead
    (`hang_grace_s`), so a long grace never starves the stacks."""
    return max(1.0, end_s - tick_s - min(grace_s, DEFAULT_GRACE_S) - END_MARGIN_S)


def hang_grace_s(end_s: float, tick_s: float, found_at: float, now: float) -> float:
    """The grace before SIGKILL once the job is ended as hung: what is left of `end_s` (at least 1 s), so that a
    long --grace (meant for a save on SIGTERM, which a hung rank never gets to) cannot push the end past it."""
    return max(1.0, found_at + end_s - tick_s - END_MARGIN_S - now)


class HangEvidence:
    """See the module docstring."""

    def __init__(
        self,
        hang: Hang,
        evidence_dir: Path,
        pids: Mapping[str, int],
        worker_gpus: Mapping[str, tuple[int, ...]],
        slot_gpus: Mapping[int, int],
        *,
        flight: bool,
        job_env: Mapping[str, str],
    ) -> None:
        self.hang = hang
        self.dir = evidence_dir
        self.pids = dict(pids)
        self.worker_gpus = dict(worker_gpus)
        self.slot_gpus = dict(slot_gpus)
        self.flight = flight
        self.job_env = dict(job_env)
        self.step = "finding the ranks' processes"  # what the thread is doing now (said if it never ends)
        self.record: dict[str, Any] = {"hang": hang.to_dict(), "at": time.time()}
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self.done = False
        self._thread: threading.Thread | None = None

    def start(self, on_done: Callable[[list[str]], None]) -> None:
        self._thread = threading.Thread(target=self._run, args=(on_done,), name="podguard-hang", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def unfinished(self, waited_s: float) -> list[str]:
        """The summary so far and one line saying what did not finish (the deadline ended the job)."""
        self.record["unfinished"] = self.step
        write_json(self.dir / "hang.json", {**self.record, "summary": self.lines()}, wait_s=LOOP_WRITE_S)
        return [*self.lines(), f"evidence incomplete after {waited_s:.0f} s (still {self.step}): ending the job"]

    def _run(self, on_done: Callable[[list[str]], None]) -> None:
        try:
            self._collect()
        except Exception as exc:  # evidence is best effort: the job is ended whatever happens here
            self._add(f"could not keep the evidence: {type(exc).__name__}: {exc}")
        self.record["summary"] = self.lines()
        write_json(self.dir / "hang.json", self.record)
        self.done = True
        on_done(self.lines())

    def _add(self, *lines: str) -> None:
        with self._lock:
            self._lines.extend(lines)

    def _collect(self) -> None:
        """Every rank's stacks first (milliseconds, while everything is as it hung), then torch's flight recorder
        through its pipe (seconds: torch symbolizes its dump)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        gpus = {name: self.worker_gpus.get(name, ()) for name in self.pids}
        targets = [self._with_gpu(t) for t in find_rank_processes(self.pids, gpus=gpus)]
        self.step = f"taking the stacks of {len(targets)} process(es) with py-spy"
        stacks = capture_ranks(targets, self.dir / "stacks")
        self.record["stacks"] = [
            {
                "name": s.target.name,
                "pid": s.target.pid,
                "rank": s.target.rank,
                "role": s.target.role,
                "gpu": s.target.gpu,
                "path": str(s.path) if s.path else None,
                "innermost_user_frame": s.innermost_user_frame,
                "collective": s.collective,
                "error": s.error,
                "stopped": s.stopped,
                "duration_ms": round(s.duration_ms, 1),
            }
            for s in stacks
        ]
        self._add(*hang_summary(stacks))
        if not self.flight:
            return
        self.step = "waiting for torch's flight recorder dump"
        dumps = trigger_flight_dump(self.dir / "flight", environ=self.job_env)
        self.record["flight_recorder"] = [str(p) for p in dumps]
        if dumps:
            self._add(f"flight recorder: {len(dumps)} dump(s) in {self.dir / 'flight'}")

    def _with_gpu(self, target: Any) -> Any:
        if target.gpu is None and target.local_rank is not None and target.local_rank in self.slot_gpus:
            return replace(target, gpu=self.slot_gpus[target.local_rank])
        return target


def write_json(path: Path, data: Mapping[str, Any], *, wait_s: float | None = None) -> None:
    """Best effort (a full volume must not turn a hang into a traceback). `wait_s`: written on a daemon thread,
    waited for at most that long: the supervisor's loop never blocks on a stalled network volume (the state dir
    is usually one; a stall there may be what hung the job)."""
    text = json.dumps(data, indent=1, default=str) + "\n"
    if wait_s is None:
        _write_text(path, text)
        return
    writer = threading.Thread(target=_write_text, args=(path, text), name="podguard-record", daemon=True)
    writer.start()
    writer.join(wait_s)


def _write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        pass

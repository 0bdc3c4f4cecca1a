"""Run this node's part of the cluster gate, answering signals at once: the one entry point job/multinode.py calls.

    outcome = run_cluster_gate(settings, verdict, notes=[...])   # the summary: a podguard line (console)
    outcome.code   # 0: launch; 76 a node failed; 75 a node did not report; the node's own code; 128+N

The store protocol runs in a helper thread (`protocol.py`; a store call is C++ that Python signal handlers
cannot interrupt); this thread waits on that thread and on the signal wakeup pipe, so a SIGTERM during
the wait ends it within milliseconds with 128+N. The summary is printed as soon as the decision is known.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from podguard import console
from podguard.errors import ExitCode, PodguardError, signal_exit_code
from podguard.launch.multinode.protocol import ACK_WAIT_S, TELL_LATE_S, run_gate
from podguard.launch.multinode.verdicts import GateOutcome, GateSettings, NodeVerdict, format_gate_summary
from podguard.launch.signals import TERMINATING, SignalRouter, signal_name

__all__ = ["run_cluster_gate"]

BACKSTOP_S = 60.0  # beyond the timeout and node 0's lingering: a store call that never returns


def run_cluster_gate(settings: GateSettings, verdict: NodeVerdict, *, notes: Sequence[str] = ()) -> GateOutcome:
    """Publish `verdict`, wait for the cluster's decision, print the gate summary; the outcome.
    Raises PodguardError (64) when node 0 cannot host the store (a port in use) or torch is missing."""
    printed = threading.Event()

    def show_summary(outcome: GateOutcome) -> None:
        outcome = replace(outcome, notes=(*outcome.notes, *notes))
        console.line(format_gate_summary(outcome, timeout_s=settings.timeout_s), loud=True)
        printed.set()

    outcome = _wait(settings, verdict, show_summary)
    if not printed.is_set():
        show_summary(outcome)
    return replace(outcome, notes=(*outcome.notes, *notes))


def _wait(settings: GateSettings, verdict: NodeVerdict, decided: Callable[[GateOutcome], None]) -> GateOutcome:
    """The gate's outcome; `decided(outcome)` is called (from the protocol's thread) as soon as it is known."""
    stop = threading.Event()
    done_r, done_w = os.pipe()
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["outcome"] = run_gate(settings, verdict, stop=stop, on_decision=decided)
        except BaseException as exc:  # handed to the waiting thread
            result["error"] = exc
        finally:
            os.write(done_w, b"x")

    router = SignalRouter(TERMINATING)
    thread = threading.Thread(target=work, name="podguard-cluster-gate", daemon=True)
    started = time.monotonic()
    backstop = started + settings.timeout_s + max(ACK_WAIT_S, TELL_LATE_S) + BACKSTOP_S
    try:
        thread.start()
        while True:
            left = backstop - time.monotonic()
            if left <= 0:
                stop.set()
                return _stopped(settings, ExitCode.GPUS_BUSY, "the store did not answer; giving up", started)
            ready, _, _ = select.select([router.rfd, done_r], [], [], left)
            signals = [s for s in router.read() if s in TERMINATING]
            if signals:
                stop.set()
                name = signal_name(signals[0])
                detail = f"received {name} while waiting for the other nodes"
                return _stopped(settings, signal_exit_code(signals[0]), detail, started)
            if done_r in ready:
                break
    finally:
        router.restore()
        if not thread.is_alive():  # a thread still running may still write to done_w: leave the pipe open
            os.close(done_r)
            os.close(done_w)
    error = result.get("error")
    if isinstance(error, PodguardError):
        raise error
    if error is not None:
        raise PodguardError(f"the cluster gate failed: {error}", ExitCode.GPUS_BUSY)
    outcome = result.get("outcome")
    assert isinstance(outcome, GateOutcome)
    return outcome


def _stopped(settings: GateSettings, code: int, detail: str, started: float) -> GateOutcome:
    return GateOutcome(
        code=code,
        nnodes=settings.nnodes,
        node_rank=settings.node_rank,
        waited_s=time.monotonic() - started,
        decided_at=time.time(),
        detail=detail,
    )

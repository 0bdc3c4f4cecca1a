"""What happens once a guard fired, and the guarded `--on-exit idle` wait.

    code = end_after_trip(trip)                       # inside a pod with a key: stop it; else 124
    code = idle_guarded(code, record, guards)         # --on-exit idle: wait for a signal or a guard

Inside a RunPod pod (RUNPOD_POD_ID) with an API key the guard stops the pod through the API: that is what
ends billing, and RunPod's stop is what ends this container (SIGTERM), so podguard waits for it as
`--on-exit stop-pod` does. Elsewhere (or when the stop request fails) podguard exits 124.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from podguard.errors import ExitCode, PodguardError, signal_exit_code
from podguard.guards.settings import ENV_POD_ID
from podguard.guards.watch import GuardWatch, Phase, Trip

__all__ = ["end_after_trip", "idle_guarded"]


def _say(out: TextIO | None, text: str) -> None:
    print(f"podguard: {text}", file=out if out is not None else sys.stderr, flush=True)


def _in_pod_with_key() -> str | None:
    pod_id = os.environ.get(ENV_POD_ID, "").strip()
    if not pod_id:
        return None
    from podguard.pods.auth import load_api_key

    try:
        load_api_key()
    except PodguardError:
        return None
    return pod_id


def end_after_trip(trip: Trip, *, out: TextIO | None = None) -> int:
    """The job is already ended: stop this pod (and wait to be ended), or exit 124."""
    out = out if out is not None else sys.stderr
    pod_id = _in_pod_with_key()
    if pod_id is None:
        _say(out, f"{trip.message}; not inside a RunPod pod with an API key: exiting {int(ExitCode.BILLING_GUARD)}")
        return ExitCode.BILLING_GUARD
    from podguard.pods.selfheal import stop_and_wait

    requested, got = stop_and_wait(pod_id, trip.message, "billing ends", out=out)
    if not requested:
        _say(out, f"the pod could not be stopped: exiting {int(ExitCode.BILLING_GUARD)}; stop it by hand")
        return ExitCode.BILLING_GUARD
    if got is not None:
        return signal_exit_code(got)
    _say(out, f"stop requested, but this container is still running: exiting {int(ExitCode.BILLING_GUARD)}")
    return ExitCode.BILLING_GUARD


def idle_guarded(code: int, record: Path | None, guards: GuardWatch, *, out: TextIO | None = None) -> int:
    """`--on-exit idle` with `--idle-stop`/`--max-cost`: keep the container up until a signal or a guard fires."""
    from podguard.pause import next_signal, signals_held

    where = f"; outcome recorded in {record}" if record is not None else ""
    with signals_held() as watched:
        _say(
            out,
            f"job ended with exit code {code}{where}. Idling to keep the container up (--on-exit idle); "
            f"{guards.describe()}; stop the pod or send SIGTERM to end",
        )
        guards.begin(Phase.AFTER, time.monotonic())
        trip = None
        while trip is None:
            got = next_signal(watched, guards.next_delay(time.monotonic()))
            if got is not None:
                _say(out, f"received {signal.Signals(got).name}; leaving (job exit code {code})")
                return code
            trip = guards.check(time.monotonic())
    return end_after_trip(trip, out=out)

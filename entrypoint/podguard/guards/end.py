"""What happens once a guard fired, and the guarded `--on-exit idle` wait.

    code = end_after_trip(trip)                       # inside a pod with a key: end its billing; else 124
    code = idle_guarded(code, record, guards)         # --on-exit idle: wait for a signal or a guard

Inside a RunPod pod with an API key the guard ends the billing through the API (pods/thispod/billing.py: a pod is
stopped, a member of an Instant Cluster deletes its cluster), and RunPod's answer to that is what ends this
container (SIGTERM), so podguard waits for it as `--on-exit stop-pod` does. Elsewhere (or when the request fails)
podguard exits 124. docs/guards.md.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from podguard import console
from podguard.errors import ExitCode, signal_exit_code
from podguard.guards.watch import GuardWatch, Phase, Trip
from podguard.pause import next_signal, signals_held
from podguard.pods.thispod.billing import Ended, end_billing
from podguard.pods.thispod.key import in_pod_with_key

__all__ = ["end_after_trip", "idle_guarded"]


def end_after_trip(trip: Trip) -> int:
    """The job is already ended: stop this pod or delete its cluster (and wait to be ended), or exit 124."""
    code = int(ExitCode.BILLING_GUARD)
    pod_id = in_pod_with_key()
    if pod_id is None:
        console.say(f"{trip.message}; not inside a RunPod pod with an API key: exiting {code}", loud=True)
        return code
    ended = end_billing(pod_id, trip.message)
    if ended.asked is None:
        console.say(_by_hand(ended, code), loud=True)
        return code
    if ended.signal is not None:
        return signal_exit_code(ended.signal)
    console.say(f"{ended.asked} requested, but this container is still running: exiting {code}", loud=True)
    return code


def _by_hand(ended: Ended, code: int) -> str:
    """The line after a failed request: the billing goes on, and what ends it by hand."""
    if ended.cluster_id is not None:
        return f"the cluster is still billing: exiting {code}; delete it by hand: podguard pod down {ended.cluster_id}"
    return f"the pod could not be stopped: exiting {code}; stop it by hand: podguard pod stop {ended.pod_id}"


def idle_guarded(code: int, record: Path | None, guards: GuardWatch) -> int:
    """`--on-exit idle` with `--idle-stop`/`--max-cost`: keep the container up until a signal or a guard fires."""
    where = f"; outcome recorded in {record}" if record is not None else ""
    with signals_held() as watched:
        guards.begin(Phase.AFTER, time.monotonic())  # before describe(): --max-runtime is over with the job
        watching = guards.describe()
        console.say(
            f"job ended with exit code {code}{where}. Idling to keep the container up (--on-exit idle); "
            + (f"{watching}; " if watching else "")
            + "stop the pod or send SIGTERM to end",
        )
        trip = None
        while trip is None:
            got = next_signal(watched, guards.next_delay(time.monotonic()))
            if got is not None:
                console.say(f"received {signal.Signals(got).name}; leaving (job exit code {code})")
                return code
            trip = guards.check(time.monotonic())
    return end_after_trip(trip)

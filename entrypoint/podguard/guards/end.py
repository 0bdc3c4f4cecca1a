"""What happens once a guard fired, and the guarded `--on-exit idle` wait.

    code = end_after_trip(trip)                       # inside a pod with a key: end its billing; else 124
    code = idle_guarded(code, record, guards)         # --on-exit idle: wait for a signal or a guard

Inside a RunPod pod (RUNPOD_POD_ID) with an API key the guard ends the billing through the API, and RunPod's
answer to that is what ends this container (SIGTERM), so podguard waits for it as `--on-exit stop-pod` does:
- a pod is stopped;
- a member of an Instant Cluster (the API shows the pod with `cluster {id, rank, ip}`) cannot be stopped (409)
  and a cluster has no stop, so the whole cluster is deleted (`DELETE /v2/clusters/{id}`; network volumes
  stay). Why the API and not the cluster variables decide: docs/guards.md.
Elsewhere (or when the request fails) podguard exits 124.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from podguard.errors import ExitCode, PodguardError, signal_exit_code
from podguard.guards.settings import ENV_POD_ID
from podguard.guards.watch import GuardWatch, Phase, Trip

if TYPE_CHECKING:
    from podguard.pods.api import PodApi
    from podguard.pods.pod import Pod

__all__ = ["end_after_trip", "end_billing", "idle_guarded"]


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
    """The job is already ended: stop this pod or delete its cluster (and wait to be ended), or exit 124."""
    out = out if out is not None else sys.stderr
    pod_id = _in_pod_with_key()
    if pod_id is None:
        _say(out, f"{trip.message}; not inside a RunPod pod with an API key: exiting {int(ExitCode.BILLING_GUARD)}")
        return ExitCode.BILLING_GUARD
    what, got = end_billing(pod_id, trip.message, out=out)
    if what is None:
        return ExitCode.BILLING_GUARD
    if got is not None:
        return signal_exit_code(got)
    _say(out, f"{what} requested, but this container is still running: exiting {int(ExitCode.BILLING_GUARD)}")
    return ExitCode.BILLING_GUARD


def end_billing(pod_id: str, why: str, *, out: TextIO) -> tuple[str | None, int | None]:
    """Ask the API to end this pod's billing, then wait (PODGUARD_SELF_HEAL_RESTART_WAIT_S, default 120 s) for
    the signal with which RunPod ends this container: (what was asked, "stop" or "cluster delete", or None when
    it could not be asked; the signal or None). Signals are held from before the request, so a SIGTERM that
    follows it at once is neither lost nor kills podguard mid-line; a failed request is two lines: why, and
    what to do by hand."""
    from podguard.pause import next_signal, signals_held
    from podguard.pods.api import open_api
    from podguard.pods.tuning import Tuning

    wait_s = Tuning.from_env().restart_wait_s
    with signals_held() as watched:
        pod: Pod | None = None
        try:
            api = open_api("rest")
            pod = api.get_pod(pod_id)
            if pod.cluster_id is None:
                _stop_pod(api, pod, why, out)
            else:
                _delete_cluster(api, pod, why, out)
        except PodguardError as exc:
            code = int(ExitCode.BILLING_GUARD)
            if pod is not None and pod.cluster_id is not None:
                cid = pod.cluster_id
                _say(out, f"warning: could not delete cluster {cid} (pod {pod_id} is its node): {exc.message}")
                _say(out, f"the cluster is still billing: exiting {code}; delete it by hand: podguard pod down {cid}")
            else:
                _say(out, f"warning: could not stop pod {pod_id}: {exc.message}")
                _say(out, f"the pod could not be stopped: exiting {code}; stop it by hand: podguard pod stop {pod_id}")
            return None, None
        assert pod is not None
        what = "stop" if pod.cluster_id is None else "cluster delete"
        return what, next_signal(watched, wait_s)


def _stop_pod(api: PodApi, pod: Pod, why: str, out: TextIO) -> None:
    from podguard.pods.actions import act_on
    from podguard.pods.pod import PodAction

    act_on(api, pod, PodAction.STOP)  # already stopped is success
    _say(out, f"{why}: stopping pod {pod.id} (billing ends)")


def _delete_cluster(api: PodApi, pod: Pod, why: str, out: TextIO) -> None:
    """One line: the trip, what is deleted and why (already gone is success: another node's guard, or a retry of
    this delete whose first answer was lost)."""
    from podguard.pods.clusters.rest import cluster_api
    from podguard.pods.errors import ApiError, ApiErrorKind

    cid = pod.cluster_id
    assert cid is not None
    node = f"node{pod.cluster_rank}" if pod.cluster_rank is not None else "a node"
    done = "deleting"
    try:
        cluster_api(api).delete_cluster(cid)
    except ApiError as exc:
        if exc.kind is not ApiErrorKind.NOT_FOUND:
            raise
        done = "already deleted (by another node's guard, or this request's own retry after a lost answer):"
    _say(
        out,
        f"{why}: this pod ({pod.id}) is {node} of Instant Cluster {cid}, whose pods cannot be stopped: {done} "
        "the whole cluster, all its nodes (network volumes stay; billing ends)",
    )


def idle_guarded(code: int, record: Path | None, guards: GuardWatch, *, out: TextIO | None = None) -> int:
    """`--on-exit idle` with `--idle-stop`/`--max-cost`: keep the container up until a signal or a guard fires."""
    from podguard.pause import next_signal, signals_held

    where = f"; outcome recorded in {record}" if record is not None else ""
    with signals_held() as watched:
        guards.begin(Phase.AFTER, time.monotonic())  # before describe(): --max-runtime is over with the job
        watching = guards.describe()
        _say(
            out,
            f"job ended with exit code {code}{where}. Idling to keep the container up (--on-exit idle); "
            + (f"{watching}; " if watching else "")
            + "stop the pod or send SIGTERM to end",
        )
        trip = None
        while trip is None:
            got = next_signal(watched, guards.next_delay(time.monotonic()))
            if got is not None:
                _say(out, f"received {signal.Signals(got).name}; leaving (job exit code {code})")
                return code
            trip = guards.check(time.monotonic())
    return end_after_trip(trip, out=out)

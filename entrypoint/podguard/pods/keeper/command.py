"""The body of `podguard pod keep`; cli/pods.py parses the options and calls `keep`.

    code = keep(KeepRequest(spec_file=Path("runpod/pod.toml"), poll=30, max_recoveries=5, ...), open_client)

Everything that can be checked is checked before the first request (64 naming the value). `--deploy` makes
the keeper pod and returns; otherwise the keeper runs here until the job is over and its exit code is the
command's (0 success, 124 guard, the job's own code, 69 a replacement would lose data, 75 gave up).

Inside a keeper pod (PODGUARD_KEEPER_OF set) an error that no retry fixes, at start-up too (a bad
PODGUARD_POLL, an unfilled secret, a bad spec: 64; a refused key: 77), stops the keeper's own pod, or parks
when not even that works: RunPod restarts a container that exits, so exiting would be a crash loop.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard.errors import ExitCode, PodguardError, UsageError

if TYPE_CHECKING:
    from podguard.pods.api import PodApi
    from podguard.pods.keeper.events import Events
    from podguard.pods.keeper.loop import KeepResult
    from podguard.pods.keeper.options import KeepOptions
    from podguard.pods.keeper.record import KeepStore
    from podguard.pods.keeper.target import Target
    from podguard.pods.spec import PodSpec

__all__ = ["KeepRequest", "keep"]


@dataclass(frozen=True)
class KeepRequest:
    spec_file: Path | None
    poll: float | str  # as given (a flag or PODGUARD_POLL): checked by keep_options
    max_recoveries: int | str
    notify: str | None
    deploy: bool
    key_secret: str | None
    as_json: bool


def _spec(request: KeepRequest) -> tuple[PodSpec, bytes]:
    from podguard.pods.keeper.deploy import ENV_SPEC_B64, spec_from_env
    from podguard.pods.spec import load_spec

    if request.spec_file is not None:
        spec = load_spec(request.spec_file)
        return spec, request.spec_file.read_bytes()
    found = spec_from_env()
    if found is None:
        raise UsageError(
            f"--spec FILE is required (the pod spec, e.g. runpod/pod.toml; a keeper pod reads {ENV_SPEC_B64})"
        )
    return found


def keep(request: KeepRequest, open_client: Callable[[PodSpec | None], PodApi]) -> int:
    """Check everything, then deploy the keeper pod or keep the job alive from here; the exit code."""
    from podguard.pods.keeper.deploy import ENV_KEEPER_OF

    if request.deploy or not os.environ.get(ENV_KEEPER_OF, "").strip():
        return _keep(request, open_client)
    try:  # inside a keeper pod
        return _keep(request, open_client)
    except PodguardError as exc:
        if exc.code != ExitCode.GPUS_BUSY:  # 75 may pass when RunPod restarts the container; the rest do not
            _cannot_go_on(exc, open_client)
        raise


def _cannot_go_on(exc: PodguardError, open_client: Callable[[PodSpec | None], PodApi]) -> None:
    """Inside a keeper pod: stop it (its logs keep the reason), else park; never a crash loop."""
    from podguard.pods.keeper.deploy import end_own_pod
    from podguard.pods.keeper.options import KNOBS, KeepOptions

    _say(f"error: {exc.message} (exit {int(exc.code)})")
    try:
        stopped = end_own_pod(open_client(None), _say, failed=exc.message)
    except PodguardError:
        stopped = False  # no client (a missing or unfilled key): nothing can stop it
    raw = os.environ.get(KNOBS["park_s"], "").strip()
    try:
        park_s = float(raw) if raw else KeepOptions.park_s
    except ValueError:
        park_s = KeepOptions.park_s
    _park(exc, stopped=stopped, wait_s=park_s if park_s > 0 else KeepOptions.park_s)


def _keep(request: KeepRequest, open_client: Callable[[PodSpec | None], PodApi]) -> int:
    from podguard.pods.keeper.deploy import ENV_KEEPER_OF
    from podguard.pods.keeper.notify import check_notify_url, is_secret_reference
    from podguard.pods.keeper.options import check_key_secret, keep_options

    options = keep_options(poll=request.poll, max_recoveries=request.max_recoveries)
    if request.key_secret is not None and not request.deploy:
        raise UsageError(f"--key-secret {request.key_secret!r} applies only with --deploy (the keeper pod's key)")
    if request.notify is not None and is_secret_reference(request.notify) and os.environ.get(ENV_KEEPER_OF):
        raise UsageError(
            f"--notify (PODGUARD_NOTIFY) is still {request.notify.strip()!r}: RunPod did not fill in that secret; "
            "create it, then `podguard pod keep --deploy` again"
        )
    notify = check_notify_url(request.notify, deployed=request.deploy) if request.notify is not None else None
    if notify is not None and not request.deploy and notify.startswith("{{"):
        raise UsageError("--notify: a RunPod secret reference only works inside a keeper pod (--deploy)")
    spec, spec_text = _spec(request)
    inside = os.environ.get(ENV_KEEPER_OF, "").strip()
    if inside and inside != spec.name:
        raise UsageError(f"{ENV_KEEPER_OF}={inside!r} but the spec's name is {spec.name!r}")
    if request.deploy:
        if inside:
            raise UsageError("--deploy inside a keeper pod: this pod is already the keeper")
        secret = check_key_secret(request.key_secret or "runpod_api_key")
        return _deploy(request, options, spec, spec_text, secret, open_client(spec))
    return _keep_here(request, spec, options, notify, open_client, deployed=bool(inside))


def _emit(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


def _say(text: str) -> None:
    print(f"podguard: {text}", file=sys.stderr, flush=True)


def _deploy(
    request: KeepRequest, options: KeepOptions, spec: PodSpec, spec_text: bytes, secret: str, client: PodApi
) -> int:
    from podguard.pods.keeper.deploy import deploy_keeper, keeper_spec
    from podguard.pods.keeper.record import KeepStore

    pid = KeepStore.open(spec.name).holder()
    if pid:
        raise UsageError(f"pod {spec.name} is kept from this machine already (pid {pid}); end that keeper first")
    keeper = keeper_spec(
        spec,
        spec_text,
        key_secret=secret,
        poll=options.poll_s,
        max_recoveries=options.max_recoveries,
        notify=request.notify,
    )
    pod, action = deploy_keeper(client, keeper, say=_say)
    _say(
        f"keeper pod {pod.name} ({pod.id}) {action}: it keeps {spec.name} with the key from RunPod secret {secret!r}; "
        f"`podguard pod logs {pod.name} --follow` shows its lines; `podguard pod down {spec.name}` ends both"
    )
    if request.as_json:
        from podguard.pods.model import public_view

        _emit({**public_view(pod), "action": action, "keeps": spec.name, "key_secret": secret})
    else:
        print(f"{pod.id}  {pod.name}  {pod.status}  keeps {spec.name}")
    return ExitCode.OK


def _keep_here(
    request: KeepRequest,
    spec: PodSpec,
    options: KeepOptions,
    notify: str | None,
    open_client: Callable[[PodSpec | None], PodApi],
    *,
    deployed: bool,
) -> int:
    from podguard.pods.auth import load_api_key
    from podguard.pods.keeper.deploy import end_own_pod, keeper_name
    from podguard.pods.keeper.events import Events
    from podguard.pods.keeper.loop import Keeper
    from podguard.pods.keeper.notify import Notifier
    from podguard.pods.keeper.record import KeepStore
    from podguard.pods.placement import pods_named

    client = open_client(spec)  # no request yet: the key (77 without one) and the API's kind
    scrub = load_api_key().scrub
    store = KeepStore.open(spec.name)
    if not store.lock():
        pid = store.holder()
        raise UsageError(
            f"pod {spec.name} is kept already by another `podguard pod keep` on this machine"
            + (f" (pid {pid})" if pid else "")
            + "; one keeper per pod"
        )
    notifier = Notifier(notify, scrub=scrub, warn=_say, deadline_s=options.notify_s) if notify else None
    events = Events(spec.name, store, notifier=notifier, scrub=scrub)
    try:
        saved = store.load()
        if deployed and saved is not None and saved.done:
            events.say("end", f"this keeper finished before ({saved.outcome}, exit {saved.code})")
            end_own_pod(client, events.note)
            return saved.code if saved.code is not None else ExitCode.OK
        if not deployed:
            keepers = pods_named(client, keeper_name(spec.name))
            if keepers:
                raise UsageError(
                    f"pod {spec.name} is kept by the keeper pod {keepers[0].name} ({keepers[0].id}); "
                    f"`podguard pod down {keepers[0].name}` first to keep it from here"
                )
        _notes(spec, events)
        target = _target(client, spec, options)
        try:
            result = Keeper(target, store, options, events, spec=spec).run()
        except PodguardError as exc:
            if deployed and exc.code != ExitCode.GPUS_BUSY:
                events.say("fatal", f"error: {exc.message} (exit {int(exc.code)})")  # keep() stops this pod
            raise
        _summary(request, spec, result, store)
        if deployed and result.outcome != "interrupted":
            end_own_pod(client, events.note)
        return result.code
    finally:
        events.close()
        store.unlock()


def _park(exc: PodguardError, *, stopped: bool, wait_s: float) -> None:
    """Inside a keeper pod, after an error no retry fixes: RunPod restarts a container that exits, so a keeper
    that could not stop its own pod (a refused or missing key) waits, announced, before exiting: one try per
    PODGUARD_KEEP_PARK_S (default 10 min, `KeepOptions.park_s`), not a crash loop hammering the API. There is
    nothing to poll for: no request can succeed, and a signal (RunPod's stop) ends the wait."""
    if stopped:
        return
    import time

    _say(
        f"error: {exc.message}; this keeper pod cannot stop itself, so it waits {wait_s:g} s before exiting (RunPod "
        "restarts it then): fix the secret and `podguard pod keep --deploy` again, or `podguard pod down` the keeper"
    )
    time.sleep(wait_s)


def _notes(spec: PodSpec, events: Events) -> None:
    if spec.volume is None or not spec.volume.network:
        events.note(
            "note: the spec has no [network_volume]: a stopped pod is started again, but a replacement (host lost, "
            "ERROR, a preflight that keeps failing) would lose the pod's data, so keep would refuse it (exit 69)"
        )


def _target(client: PodApi, spec: PodSpec, options: KeepOptions) -> Target:
    from podguard.pods.keeper.target import ClusterTarget, PodTarget
    from podguard.pods.tuning import Tuning

    tuning = Tuning.from_env()
    if spec.cluster is not None:
        from podguard.pods.clusters.rest import cluster_api

        return ClusterTarget(cluster_api(client), spec, tuning, options.silence_s)
    return PodTarget(client, spec, tuning)


def _summary(request: KeepRequest, spec: PodSpec, result: KeepResult, store: KeepStore) -> None:
    state = result.state
    if request.as_json:
        _emit(
            {
                "name": spec.name,
                "kind": state.kind,
                "id": state.target_id or None,
                "outcome": result.outcome,
                "code": result.code,
                "recoveries": state.recoveries,
                "message": result.message,
                "events": str(store.events_path),
            }
        )
    else:
        print(f"{spec.name}: {result.outcome} (exit {result.code}) after {state.recoveries} recovery(ies)")

"""The body of `podguard pod keep`; cli/pod_recovery.py parses the options and calls `keep`.

    code = keep(KeepRequest(spec_file=Path("runpod/pod.toml"), poll=30, max_recoveries=5, ...), open_client)

Everything that can be checked is checked before the first request (64 naming the value). `--deploy` makes (or
reuses) the keeper pod and returns; otherwise the keeper runs here until the job is over and its exit code is the
command's (0 success, 124 guard, the job's own code, 1 a crash loop, 69 a replacement would lose data, 75 gave up;
0 when the user's newer word ended it). Before it begins: one keeper of the name per machine (registry.py), a pod
of the name without podguard's mark is refused unless adopted, a kind change is refused, a keeper pod that is alive
is refused and a lost one taken over (claim.py); then the keep's word is written (a laptop) or read (a keeper pod).

Inside a keeper pod (PODGUARD_KEEPER_OF set) every way out but a transient 75 (an error no retry fixes, at start-up
too: a bad PODGUARD_POLL, an unfilled secret, a bad spec: 64; a refused key: 77; any unexpected exception) stops the
keeper's own pod, or parks when not even that works: RunPod restarts a container that exits, so exiting would be a
crash loop. A keeper pod whose keep is over terminates its own pod, after its end message was delivered (or its
deadline passed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.pods.api import PodApi
from podguard.pods.auth import load_api_key
from podguard.pods.clusters.rest import cluster_api
from podguard.pods.keeper.actuate import Actuator
from podguard.pods.keeper.claim import KeepOver, claim_here, claim_inside, deploy, refuse_strangers
from podguard.pods.keeper.deploy import ENV_KEEPER_OF, ENV_SPEC_B64, end_own_pod, keeper_spec, spec_from_env
from podguard.pods.keeper.events import Events
from podguard.pods.keeper.fence import Fence
from podguard.pods.keeper.intent import Intent, Word
from podguard.pods.keeper.intent_store import IntentStore
from podguard.pods.keeper.kept import Kept, KeptPod
from podguard.pods.keeper.kept_cluster import KeptCluster
from podguard.pods.keeper.loop import Keeper, KeepResult
from podguard.pods.keeper.notify import Notifier, check_notify_url, is_secret_reference
from podguard.pods.keeper.options import KNOBS, KeepOptions, check_key_secret, keep_options
from podguard.pods.keeper.record import KeepState, KeepStore
from podguard.pods.keeper.registry import Refused, Unregistered, register
from podguard.pods.kinds import refuse_other_kind
from podguard.pods.pod import public_view
from podguard.pods.spec import PodSpec, load_spec
from podguard.pods.tuning import Tuning

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
    adopt: tuple[str, ...] = ()  # --adopt POD_ID: pods (clusters) of the name without the mark, handed over


def _spec(request: KeepRequest) -> tuple[PodSpec, bytes]:
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
    if request.deploy or not os.environ.get(ENV_KEEPER_OF, "").strip():
        return _keep(request, open_client)
    try:  # inside a keeper pod: every way out but a transient one stops this pod
        return _keep(request, open_client)
    except PodguardError as exc:
        if exc.code != ExitCode.GPUS_BUSY:  # 75 may pass when RunPod restarts the container; the rest do not
            _cannot_go_on(exc, open_client)
        raise
    except Exception as exc:  # the keeper's own fault must not leave its pod crash-looping: stopped, like an error
        failure = PodguardError(f"unexpected {type(exc).__name__}: {exc}", ExitCode.FAILURE)
        _cannot_go_on(failure, open_client)
        raise


def _cannot_go_on(exc: PodguardError, open_client: Callable[[PodSpec | None], PodApi]) -> None:
    """Inside a keeper pod: stop it (its logs keep the reason), else park; never a crash loop."""
    console.say(f"error: {exc.message} (exit {int(exc.code)})", loud=True)
    try:
        stopped = end_own_pod(open_client(None), failed=exc.message)
    except PodguardError:
        stopped = False  # no client (a missing or unfilled key): nothing can stop it
    raw = os.environ.get(KNOBS["park_s"], "").strip()
    try:
        park_s = float(raw) if raw else KeepOptions.park_s
    except ValueError:
        park_s = KeepOptions.park_s
    _park(exc, stopped=stopped, wait_s=park_s if park_s > 0 else KeepOptions.park_s)


def _keep(request: KeepRequest, open_client: Callable[[PodSpec | None], PodApi]) -> int:
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
    for pod_id in request.adopt:
        if not pod_id.strip() or any(c.isspace() for c in pod_id):
            raise UsageError(f"--adopt {pod_id!r} is not valid; expected the id of a pod (cluster) of the spec's name")
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


def _refused(name: str, refused: Refused) -> UsageError:
    entry = refused.entry
    return UsageError(
        f"pod {name} is kept already by another `podguard pod keep` on this machine ({entry.where()}); one keeper "
        "per pod: end it first (`podguard pod stop` or `pod down` ends every keeper of the name)"
    )


def _deploy(
    request: KeepRequest, options: KeepOptions, spec: PodSpec, spec_text: bytes, secret: str, client: PodApi
) -> int:
    local = register(spec.name, poll_s=options.poll_s)  # a moment's claim: no keeper of the name here meanwhile
    if isinstance(local, Refused):
        raise _refused(spec.name, local)
    try:
        refuse_strangers(client, spec, adopt=request.adopt)
        refuse_other_kind(client, spec)

        def make_keeper(gen: int, keep_id: str) -> PodSpec:
            return keeper_spec(
                spec,
                spec_text,
                key_secret=secret,
                poll=options.poll_s,
                max_recoveries=options.max_recoveries,
                notify=request.notify,
                gen=gen,
                keep_id=keep_id,
            )

        tuning = Tuning.from_env()
        pod, action = deploy(client, spec, make_keeper, adopt=request.adopt, poll_s=tuning.poll_s)
    finally:
        local.close()
    if action == "reused":
        running = pod.env.get(ENV_SPEC_B64)
        if running is not None and running != make_keeper(0, "").env[ENV_SPEC_B64]:
            console.say(
                f"note: keeper pod {pod.name} keeps an older version of the spec; `podguard pod down {spec.name}` "
                "and deploy again to change it"
            )
    console.say(
        f"keeper pod {pod.name} ({pod.id}) {action}: it keeps {spec.name} with the key from RunPod secret {secret!r}; "
        f"`podguard pod logs {pod.name} --follow` shows its lines; `podguard pod down {spec.name}` ends both"
    )
    if request.as_json:
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
    client = open_client(spec)  # no request yet: the key (77 without one) and the API's kind
    scrub = load_api_key().scrub  # the console masks the key; records and webhook posts are scrubbed of it
    with console.tagged(f"keep {spec.name}"):  # every line of this keeper carries its name
        return _keep_tagged(request, spec, options, notify, client, scrub, deployed=deployed)


def _keep_tagged(
    request: KeepRequest,
    spec: PodSpec,
    options: KeepOptions,
    notify: str | None,
    client: PodApi,
    scrub: Callable[[str], str],
    *,
    deployed: bool,
) -> int:
    tuning = Tuning.from_env()
    local = register(spec.name, poll_s=options.poll_s, state_dir=str(os.environ.get("PODGUARD_STATE_DIR", "")))
    if isinstance(local, Refused):
        raise _refused(spec.name, local)
    if isinstance(local, Unregistered):
        console.warn(
            f"the keepers' registry cannot be used ({local.why}): `pod down` on this machine reaches this "
            "keeper through the keep's record only (before its next action), and cannot wait for a create in flight"
        )
    store = KeepStore.open(spec.name)
    if not store.lock():
        local.close()
        raise UsageError(f"pod {spec.name} is kept already by another `podguard pod keep` with this state dir")
    notifier = Notifier(notify, scrub=scrub, deadline_s=options.notify_s) if notify else None
    events = Events(spec.name, store, notifier=notifier, scrub=scrub)
    try:
        previous = None
        if deployed:
            try:
                mine = previous = claim_inside(client, spec, os.environ)
            except KeepOver as over:
                events.say("end", f"the keep this keeper pod was made for is over: {over.why}")
                events.close()  # its message first: then the pod that would deliver it goes
                end_own_pod(client)
                return ExitCode.OK
            refuse_other_kind(client, spec)
        else:
            refuse_other_kind(client, spec)
            mine, previous = _claim(client, spec, store, request, tuning)
        _notes(spec)
        fence = Fence(
            IntentStore(client, spec.name),
            mine,
            on_lease=local.lease,
            on_release=local.release,
            pending=local.pending,
            land_s=options.land_s,
        )
        hands = Actuator(client, fence, tuning, confirm_s=options.confirm_s)
        target = _target(client, spec, options, tuning, keep_id=mine.keep)
        try:
            keeper = Keeper(target, store, options, events, spec=spec, hands=hands, fence=fence, previous=previous)
            result = keeper.run()
        except PodguardError as exc:
            if deployed and exc.code != ExitCode.GPUS_BUSY:
                events.say("fatal", f"error: {exc.message} (exit {int(exc.code)})")  # keep() stops this pod
            raise
        console.settle()
        _summary(request, spec, result, store)
        if deployed and result.outcome != "interrupted":
            events.close()  # the end message is delivered (or its deadline passed) before this pod goes
            end_own_pod(client)
        return result.code
    finally:
        events.close()
        store.unlock()
        local.close()


def _claim(
    client: PodApi, spec: PodSpec, store: KeepStore, request: KeepRequest, tuning: Tuning
) -> tuple[Intent, Intent | None]:
    """A laptop keep's word: the one in the record when this state dir's keep is under way there (a keeper killed
    and started again: no new generation, and a pod of the name without the mark that appeared meanwhile is left
    alone); else a new keep: strangers refused, a new `kept` written (its identity noted in the state first)."""
    saved = store.load()
    current = IntentStore(client, spec.name).read()
    under_way = saved is not None and not saved.done and current is not None and current.word is Word.KEPT
    if under_way and saved is not None and current is not None and saved.owns(current.keep):
        return current, current
    refuse_strangers(client, spec, adopt=request.adopt)
    state = saved if saved is not None and not saved.done else KeepState(name=spec.name, kind=_kind(spec))

    def note(keep_id: str) -> None:
        state.claiming = keep_id
        store.save(state)

    return claim_here(client, spec, adopt=request.adopt, poll_s=tuning.poll_s, claiming=note)


def _kind(spec: PodSpec) -> str:
    return "cluster" if spec.cluster is not None else "pod"


def _park(exc: PodguardError, *, stopped: bool, wait_s: float) -> None:
    """Inside a keeper pod, after an error no retry fixes: RunPod restarts a container that exits, so a keeper
    that could not stop its own pod (a refused or missing key) waits, announced, before exiting: one try per
    PODGUARD_KEEP_PARK_S (default 10 min, `KeepOptions.park_s`), not a crash loop hammering the API. There is
    nothing to poll for: no request can succeed, and a signal (RunPod's stop) ends the wait."""
    if stopped:
        return
    console.say(
        f"error: {exc.message}; this keeper pod cannot stop itself, so it waits {wait_s:g} s before exiting (RunPod "
        "restarts it then): fix the secret and `podguard pod keep --deploy` again, or `podguard pod down` the keeper"
    )
    time.sleep(wait_s)


def _notes(spec: PodSpec) -> None:
    if (spec.volume is None or not spec.volume.network) and not spec.store:
        console.say(
            "note: the spec has no [network_volume] and no [checkpoints] store: a stopped pod is started again, but a "
            "replacement (host lost, ERROR, a preflight that keeps failing) would lose the pod's data, so keep would "
            "refuse it (exit 69)"
        )


def _target(client: PodApi, spec: PodSpec, options: KeepOptions, tuning: Tuning, *, keep_id: str) -> Kept:
    if spec.cluster is not None:
        return KeptCluster(cluster_api(client), spec, tuning, options.silence_s, keep_id=keep_id)
    return KeptPod(client, spec, tuning, keep_id=keep_id)


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

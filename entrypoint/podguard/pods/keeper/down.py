"""`pod down REF` and `pod stop REF` as the CLI runs them: which pod (cluster) the user named, then the name's end.

    down_or_stop(client, "llm-train", PodAction.TERMINATE, as_json=False, emit=print)

A cluster member named by its id is that node (its cluster's own commands otherwise). A pod named by its id that is
not podguard's is acted on alone: the user's hand on that pod. Otherwise the name's keep ends and is swept
(sweep.py: the word written, every keeper ended, nothing of the name left billing), and a pod of the name that is
not podguard's is acted on only when it is the one thing of a name no keep ever claimed (the user named it: a pod
made by hand, or by a podguard from before the mark); otherwise it is left as it is, and said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.pods.actions import ActionResult, act_on
from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Cluster
from podguard.pods.clusters.commands import act_on_member
from podguard.pods.clusters.rest import cluster_api, not_a_cluster_action
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.intent import Word
from podguard.pods.keeper.sweep import Ended, end_name
from podguard.pods.mark import owned, stranger_line
from podguard.pods.pod import PodAction, PodStatus, public_view
from podguard.pods.tuning import Tuning

__all__ = ["ByRef", "down_or_stop", "end_by_ref"]


@dataclass
class ByRef:
    """What `pod down REF` / `pod stop REF` did, for the CLI to print."""

    name: str
    ended: Ended | None = None  # the name's keep ended and swept (None: a pod named by id that is not podguard's)
    direct: ActionResult | None = None  # a pod acted on directly: the user's own, named by its id or alone by name
    cluster_down: Cluster | None = None  # the user's own cluster of the name, deleted directly

    @property
    def nothing(self) -> bool:
        """Nothing of that name or id existed, and no keeper was ended."""
        return (
            self.direct is None
            and self.cluster_down is None
            and (self.ended is None or (not self.ended.changed and not self.ended.owned_seen))
        )


def end_by_ref(api: PodApi, ref: str, word: Word, *, tuning: Tuning) -> ByRef:
    """`pod down REF` / `pod stop REF`: a pod named by its id that is not podguard's is acted on alone (the user's
    hand on that pod); otherwise the name's keep is ended and swept (end_name), and a pod of the name that is not
    podguard's is acted on only when it is the one thing of a name no keep ever claimed (the user named it: a pod made
    by hand, or by a podguard from before the mark), else left as it is, said."""
    action = PodAction.TERMINATE if word is Word.DOWN else PodAction.STOP
    pods = [p for p in api.list_pods() if p.status is not PodStatus.TERMINATED]
    by_id = next((p for p in pods if p.id == ref), None)
    if by_id is not None and not owned(by_id, by_id.name):
        return ByRef(by_id.name, direct=act_on(api, by_id, action))
    clusters = cluster_api(api)
    listed = clusters.list_clusters()
    cluster = next((c for c in listed if c.id == ref), None)
    name = by_id.name if by_id is not None else cluster.name if cluster is not None else ref
    if word is Word.STOPPED and not any(p.name == name for p in pods):
        named = cluster or next((c for c in listed if c.name == name), None)
        if named is not None:
            raise not_a_cluster_action(named.name, "stop")
    ended = end_name(api, name, word, tuning=tuning)
    adopted = ended.intent.adopted if ended.intent is not None else ()
    theirs = [p for p in api.list_pods() if p.name == name and p.status is not PodStatus.TERMINATED]
    theirs = [p for p in theirs if not owned(p, name, adopted)]
    result = ByRef(name, ended=ended)
    plain = not ended.owned_seen and not ended.kept_before  # a name podguard never kept: the user named that pod
    if theirs and plain and len(theirs) == 1:
        result.direct = act_on(api, theirs[0], action)
    elif len(theirs) > 1 and plain:
        ids = ", ".join(p.id for p in theirs)
        raise UsageError(f"{len(theirs)} pods are named {name!r} ({ids}) and none is podguard's; name one by its id")
    else:
        for pod in theirs:
            console.say(
                f"{stranger_line(pod)} is named {name} but is not podguard's (no mark): left as it is (`pod down ID`)"
            )
    if word is Word.DOWN and plain and result.direct is None:
        others = [c for c in clusters.list_clusters() if c.name == name]
        if len(others) == 1:  # the user's own cluster, named: deleted as asked
            clusters.delete_cluster(others[0].id)
            result.cluster_down = others[0]
    return result


def down_or_stop(client: PodApi, ref: str, wanted: PodAction, *, as_json: bool, emit: Callable[[Any], None]) -> None:
    """The whole `pod down` / `pod stop` of the CLI: act, then say what was done (exit 75 when something does not
    read back yet; 66 when `stop` finds nothing at all)."""
    members = [m for m in cluster_api(client).member_pods() if m.pod.id == ref]
    if members:
        result = act_on_member(client, members[0], wanted)
        console.say(result.message)
        if as_json:
            emit({**(public_view(result.pod) if result.pod else {}), "changed": result.changed, "terminated": True})
        return
    word = Word.DOWN if wanted is PodAction.TERMINATE else Word.STOPPED
    done = end_by_ref(client, ref, word, tuning=Tuning.from_env())
    ended = done.ended
    if done.direct is not None:
        console.say(done.direct.message)
    if done.cluster_down is not None:
        console.say(
            f"cluster {done.cluster_down.name} ({done.cluster_down.id}) deleted: all {done.cluster_down.nodes} nodes"
        )
    verb = "down" if word is Word.DOWN else "stop"
    if ended is not None and ended.left:
        raise PodguardError(
            f"{done.name}: {', '.join(ended.left)} did not read back {'gone' if word is Word.DOWN else 'stopped'} "
            f"yet; `podguard pod {verb} {done.name}` again",
            ExitCode.GPUS_BUSY,
        )
    if done.nothing:
        if wanted is PodAction.STOP:
            missing = f"no pod named {ref!r} or with that id, and no such cluster (see `podguard pod list`)"
            raise ApiError(ApiErrorKind.NOT_FOUND, missing)
        console.say(f"no pod or cluster named {ref!r} or with that id: nothing to take down")
    elif ended is not None:
        if not ended.touched and done.direct is None and done.cluster_down is None:
            what = "take down" if word is Word.DOWN else "stop"
            console.say(f"no pod or cluster named {ref!r} or with that id: nothing to {what}; its keeper was ended")
        if ended.waited_s >= 1:
            console.say(
                f"{done.name}: waited {ended.waited_s:.0f} s for what a keeper may have sent; nothing of it bills"
            )
        if word is Word.STOPPED and ended.keepers:
            console.say(
                f"{done.name} is no longer kept: nothing starts it again; `podguard pod keep --spec FILE` (or "
                "`--deploy`) keeps it again"
            )
    pod = done.direct.pod if done.direct is not None else None
    if as_json:
        changed = bool(done.direct and done.direct.changed) or bool(ended and ended.changed) or bool(done.cluster_down)
        emit({**(public_view(pod) if pod is not None else {}), "changed": changed, "terminated": word is Word.DOWN})
    elif pod is not None:
        print(f"{pod.id}  {pod.status}")

"""What the keeper does next, from the pod's (or cluster's) status and podguard's own lines: pure, no I/O.

    view = JobView()
    view.take(0, read_line(line), now=time.monotonic())     # each decisive line, per node (rank; a pod is 0)
    decision = decide(Observed(PodStatus.EXITED, {0: NodeState(PodStatus.EXITED, None)}), view, now=..., ...)
    decision.act, decision.reason                           # Act.START, "EXITED without an outcome"

The rules (docs/running-pods.md, "What it does"): an outcome in the lines is respected (success,
a billing guard, the job's own failure); otherwise what broke is recovered: EXITED -> start; ERROR, gone, a
node lost, a pod seen running its container that is now without a runtime and silent for the silence window, a
pod that never got its container within `[ready] timeout_s` (a slow image pull is not a lost host), a pod that
RunPod started with fewer GPUs than it was made with (a resumed pod may come back with none: its preflight ends
69), a preflight that did not pass on SICK_STARTS starts in a row, a GPU fault that ended the job -> replace. A
container that prints lines but never podguard's preflight line within `[ready] timeout_s`, or that starts again
CRASH_RESTARTS times within CRASH_WINDOW_S (each preflight line not announced by an in-pod RESTART line is a
container start), crash-loops: the job's failure (finish: stop it). A status the keeper does not know is read
again, never taken for ERROR. A cluster is never started, only replaced whole. Decisions taken from the status
alone are marked `settle`: the caller first reads what is still in flight on the log stream (an END line printed
just before the pod stopped), then decides again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from podguard.durations import format_duration
from podguard.errors import ExitCode
from podguard.outcome_lines import EndKind
from podguard.pods.keeper.lines import Cue, CueKind
from podguard.pods.pod import PodStatus

__all__ = [
    "CRASH_RESTARTS",
    "CRASH_WINDOW_S",
    "SICK_STARTS",
    "Act",
    "Decision",
    "JobView",
    "NodeState",
    "NodeView",
    "Observed",
    "Outcome",
    "decide",
]

SICK_STARTS = 3  # a preflight that did not pass on this many starts in a row: the machine, not the job
CRASH_RESTARTS = 5  # the container started again (after its first start) this many times ...
CRASH_WINDOW_S = 600.0  # ... within this long, without the keeper starting it: a crash loop


class Act(StrEnum):
    WAIT = "wait"
    START = "start"
    REPLACE = "replace"
    FINISH = "finish"


class Outcome(StrEnum):
    SUCCESS = "success"  # stop the pod (delete the cluster), exit 0
    GUARD = "guard"  # an in-pod billing guard ended it: nothing restarted, exit 124
    FAILED = "failed"  # the job's own failure on a healthy pod: stop it, exit the job's code
    CRASH_LOOP = "crash-loop"  # the container restarts without running the job: the job's failure, stop it, exit 1


@dataclass
class NodeView:
    """What one node's lines said since the keeper watches it."""

    streak: int = 0  # preflight verdicts other than PASS in a row
    passed: bool = False  # the newest verdict was PASS
    gpu_fault: bool = False  # an END gpu-fault: the machine failed the job
    ran: bool = False  # seen running its container (a runtime, or a line) since the last start
    lines: bool = False  # a line of its log came since the last start (its container prints)
    short: bool = False  # the preflight found fewer GPUs than it needs (END preflight exit 69): the host's
    preflight: bool = False  # podguard's preflight line came since the last start: the container runs podguard
    boots: list[float] = field(default_factory=list)  # container starts seen (preflight lines no RESTART announced)
    announced: bool = False  # a RESTART line came: the next preflight line is an in-pod relaunch, not a boot


@dataclass
class JobView:
    """What the lines of every node said: the outcome once known, and what points at a sick machine."""

    nodes: dict[int, NodeView] = field(default_factory=dict)
    outcome: Outcome | None = None
    code: int = 0
    detail: str = ""
    guard_seen: bool = False  # a guard line: the pod will stop (or the cluster go) because of it
    primary: int = 0  # the node whose END success is the job's (a cluster's node 0)
    ended: set[int] = field(default_factory=set)  # the nodes that printed an END line

    def node(self, rank: int) -> NodeView:
        return self.nodes.setdefault(rank, NodeView())

    def take(self, rank: int, cue: Cue, now: float = 0.0) -> str | None:
        """Apply one cue (seen at `now`, monotonic); return what it means in words when it is worth an event."""
        node = self.node(rank)
        if cue.kind is CueKind.VERDICT:
            node.passed = cue.word == "PASS"
            node.streak = 0 if node.passed else node.streak + 1
            node.preflight = True
            if not node.announced:
                node.boots.append(now)
            node.announced = False
            if node.passed:
                return "preflight PASS: the job runs"
            return f"preflight {cue.word} ({node.streak} start(s) in a row)"
        if cue.kind is CueKind.RESTART:
            node.announced = True
            return f"in-pod restart {cue.word} (the job relaunches itself; not the end)"
        if cue.kind is CueKind.GUARD:
            self.guard_seen = True
            return f"billing guard {cue.word} fired in the pod"
        return self._end(rank, node, cue.word, cue.code or 0, cue.line)  # an END line (lines.py gives it a code)

    def _end(self, rank: int, node: NodeView, kind: EndKind | str, code: int, line: str) -> str | None:
        self.ended.add(rank)
        if self.outcome is not None:
            return None  # the first outcome stands
        if kind == EndKind.SIGNAL:
            return f"the job was ended from outside (exit {code}): not an outcome"
        if kind == EndKind.GUARD:
            self._set(Outcome.GUARD, ExitCode.BILLING_GUARD, line)
            return "END guard: a billing guard ended the job"
        if kind == EndKind.GPU_FAULT:
            node.gpu_fault = True
            return f"a GPU fault ended the job (exit {code}): the machine, not the job"
        if kind == EndKind.PREFLIGHT:
            if code == ExitCode.GPUS_MISSING:  # RunPod started it with fewer GPUs than the spec: the host's problem
                node.short = True
                return f"the preflight found fewer GPUs than the job needs (exit {code}): the host, not the job"
            if code == ExitCode.USAGE:  # the pod's own configuration is refused: no machine would run it
                self._set(Outcome.FAILED, code, line)
                return f"the pod refuses its own configuration (exit {code})"
            return None  # a sick machine: its verdict line counted already
        if kind == EndKind.SUCCESS:
            if rank != self.primary:
                return None  # a cluster's job ends on node 0
            self._set(Outcome.SUCCESS, ExitCode.OK, line)
            return "END success: the job is over"
        self._set(Outcome.FAILED, code, line)  # failed | hung: the job's own
        return f"END {kind} (exit {code}): the job's own failure, after its in-pod restarts"

    def _set(self, outcome: Outcome, code: int, line: str) -> None:
        self.outcome, self.code, self.detail = outcome, int(code), line

    def after_recovery(self, *, replaced: bool) -> None:
        """A start keeps counting a sick machine's starts; a replacement is a new machine. What the old job's
        lines said is over (a recovery is only made when they said no outcome, or a lost node explained it)."""
        self.guard_seen = False
        self.outcome, self.code, self.detail = None, 0, ""
        self.ended.clear()
        for node in self.nodes.values():
            node.gpu_fault = node.short = node.ran = node.lines = False
            node.passed = node.preflight = node.announced = False
            node.boots.clear()
            if replaced:
                node.streak = 0


@dataclass(frozen=True)
class NodeState:
    status: PodStatus | None  # None: the node's pod is gone
    has_runtime: bool | None = None  # None: not known (not listed this time)
    gpus: tuple[int, int] | None = None  # (GPUs it has, GPUs the spec asks) when RunPod gave it fewer


@dataclass(frozen=True)
class Observed:
    """One status read: the pod's (a cluster's aggregate) status, None when it is gone; what is known per node."""

    status: PodStatus | None
    nodes: Mapping[int, NodeState] = field(default_factory=dict)
    cluster: bool = False
    lost: tuple[int, ...] = ()  # a cluster's nodes that left RUNNING or are gone (from a member listing)


@dataclass(frozen=True)
class Decision:
    act: Act
    reason: str = ""
    settle: bool = False  # taken from the status alone: read the stream's last lines, then decide again
    detail: str = ""  # a crash loop: what was seen, in words


_STOPPED = (PodStatus.EXITED, PodStatus.ERROR, PodStatus.TERMINATED)
# desiredStatus RUNNING: REST v2 says RUNNING whether or not a container runs (`runtime` null or not); podguard's
# GraphQL decoding says STARTING or PROVISIONING while `runtime` is null. The silence rule holds for all three.
_MEANT_TO_RUN = (PodStatus.RUNNING, PodStatus.STARTING, PodStatus.PROVISIONING)


def decide(
    observed: Observed,
    view: JobView,
    *,
    now: float,
    quiet_since: Mapping[int, float],
    silence_s: float,
    booting_since: float | None = None,
    ready_s: float = float("inf"),
) -> Decision:
    """The next step (see the module docstring); `quiet_since` is each node's last log line (monotonic);
    `booting_since` when the current start (or create) was made, `ready_s` the spec's `[ready] timeout_s`."""
    if view.outcome is not None:
        peers = _lost_peers(observed, view) if view.outcome is Outcome.FAILED and observed.cluster else []
        if peers:  # a node failed because a peer's host went (NCCL errors within seconds; the host shows later)
            return Decision(
                Act.REPLACE,
                f"the job failed while {', '.join(f'node{r}' for r in peers)} was lost (its host, not the job): "
                "a cluster is replaced whole",
            )
        return Decision(Act.FINISH, view.outcome.value)
    faulted = sorted(r for r, n in view.nodes.items() if n.gpu_fault)
    if faulted:
        return Decision(Act.REPLACE, f"a GPU fault ended the job on {_named(faulted, observed)}")
    short = _short(observed, view)
    if short:
        return Decision(Act.REPLACE, short)
    sick = sorted(r for r, n in view.nodes.items() if n.streak >= SICK_STARTS)
    if sick:
        return Decision(
            Act.REPLACE, f"the preflight did not pass on {SICK_STARTS} starts in a row on {_named(sick, observed)}"
        )
    restarts = {r: sum(now - t <= CRASH_WINDOW_S for t in n.boots) - 1 for r, n in view.nodes.items()}
    looping = sorted(r for r, count in restarts.items() if count >= CRASH_RESTARTS)
    if looping:
        return Decision(
            Act.FINISH,
            Outcome.CRASH_LOOP.value,
            detail=f"the container of {_named(looping, observed)} started again {max(restarts.values())} times "
            f"within {format_duration(CRASH_WINDOW_S)} without the keeper starting it: it crash-loops",
        )
    if observed.status is PodStatus.UNKNOWN:
        return Decision(Act.WAIT, "its status is not one the keeper knows: read again")
    if observed.status is None or observed.status is PodStatus.TERMINATED:
        if view.guard_seen:
            return Decision(Act.FINISH, Outcome.GUARD.value, settle=True)
        return Decision(Act.REPLACE, "it is gone (no longer in the API)", settle=True)
    if observed.cluster and (observed.lost or observed.status in _STOPPED):
        if view.guard_seen:
            return Decision(Act.FINISH, Outcome.GUARD.value, settle=True)
        lost = _lost_nodes(observed)
        return Decision(Act.REPLACE, f"{lost} left RUNNING: a cluster is replaced whole", settle=True)
    if observed.status is PodStatus.EXITED:
        if view.guard_seen:
            return Decision(Act.FINISH, Outcome.GUARD.value, settle=True)
        return Decision(Act.START, "EXITED without an outcome (maintenance, an outage or a stop)", settle=True)
    if observed.status is PodStatus.ERROR:
        if view.guard_seen:
            return Decision(Act.FINISH, Outcome.GUARD.value, settle=True)
        return Decision(Act.REPLACE, "in ERROR", settle=True)
    silent = sorted(
        rank
        for rank, node in observed.nodes.items()
        if node.status in _MEANT_TO_RUN
        and node.has_runtime is False
        and view.node(rank).ran
        and now - quiet_since.get(rank, now) >= silence_s
    )
    if silent:
        return Decision(
            Act.REPLACE,
            f"RUNNING with no runtime and no log line for {format_duration(silence_s)} on "
            f"{_named(silent, observed)} (its host is lost)",
        )
    if booting_since is not None and now - booting_since >= ready_s:
        looped = _no_preflight(observed, view)
        if looped:
            return Decision(
                Act.FINISH,
                Outcome.CRASH_LOOP.value,
                detail=f"the container of {_named(looped, observed)} runs but podguard's preflight line did not come "
                f"within {format_duration(ready_s)} ([ready] timeout_s): it crash-loops (an exec error, a missing "
                "entrypoint) or is not running podguard",
            )
        late = _not_started(observed, view)
        if late:
            return Decision(
                Act.REPLACE,
                f"{_named(sorted(late), observed)} did not start within {format_duration(ready_s)} ([ready] "
                f"timeout_s): {'; '.join(late.values())}",
            )
    return Decision(Act.WAIT)


def _no_preflight(observed: Observed, view: JobView) -> list[int]:
    """The nodes meant to run whose container printed lines, but never podguard's preflight line."""
    return sorted(
        rank
        for rank, node in observed.nodes.items()
        if node.status in _MEANT_TO_RUN and view.node(rank).lines and not view.node(rank).preflight
    )


def _not_started(observed: Observed, view: JobView) -> dict[int, str]:
    """The nodes meant to run that never ran their container since the last start, with their status in words."""
    late: dict[int, str] = {}
    for rank, node in observed.nodes.items():
        if node.status not in _MEANT_TO_RUN or view.node(rank).ran or node.has_runtime or view.node(rank).preflight:
            continue
        if node.status is PodStatus.RUNNING and node.has_runtime is None:
            continue  # not known (a cluster's members are listed only now and then)
        late[rank] = f"still {node.status}" if node.status is not PodStatus.RUNNING else "RUNNING with no container"
    if not observed.nodes and observed.status in (PodStatus.PROVISIONING, PodStatus.STARTING):
        late[0] = f"still {observed.status}"  # a cluster whose members were never listed
    return late


def _short(observed: Observed, view: JobView) -> str:
    """A node RunPod started with fewer GPUs than the spec, from the API or from its preflight's exit 69."""
    for rank, node in sorted(observed.nodes.items()):
        if node.gpus is not None and node.status is PodStatus.RUNNING:
            have, want = node.gpus
            return (
                f"RunPod started {_named([rank], observed)} with {have} of its {want} GPU(s) (a resumed pod can come "
                "back without GPUs when its host has none free): the host, not the job"
            )
    short = sorted(r for r, n in view.nodes.items() if n.short)
    if short:
        where = _named(short, observed)
        return f"the preflight found fewer GPUs than the spec on {where} (exit 69): the host, not the job"
    return ""


def _lost_peers(observed: Observed, view: JobView) -> list[int]:
    """A cluster's nodes that printed no END line and are not running a container: gone, stopped, in ERROR, or
    meant to run with no runtime (a lost host). A failure on another node is then not the job's own."""
    peers = set(observed.lost)
    for rank, node in observed.nodes.items():
        no_container = node.status in _MEANT_TO_RUN and node.has_runtime is False
        if node.status is None or node.status in _STOPPED or no_container:
            peers.add(rank)
    return sorted(peers - view.ended)


def _named(ranks: list[int], observed: Observed) -> str:
    if not observed.cluster:
        return "the pod"
    return ", ".join(f"node{r}" for r in ranks)


def _lost_nodes(observed: Observed) -> str:
    if observed.lost:
        states = ", ".join(
            f"node{r} ({observed.nodes[r].status or 'gone'})" if r in observed.nodes else f"node{r} (gone)"
            for r in observed.lost
        )
        return states
    return f"a node ({observed.status})"

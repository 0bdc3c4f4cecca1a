"""The keeper's loop: one listing of the name per poll, one log stream per node, until the job is over.

    code = Keeper(target, store, options, events, spec=spec, hands=hands, fence=fence).run()

A reconciler (docs/running-pods.md, "How the keeper decides"): each poll lists the name and converges on exactly
one pod (cluster) of the keeper's own (reconcile.py), then decide.py judges that one from its status and podguard's
lines; between polls the loop waits on the log streams, so a decisive line (an END line, a verdict, the guard line)
is acted on as it arrives. Every action goes through the keeper's hands (actuate.py): fenced by the user's word,
read back. recovery.py starts and replaces, ending.py stops and ends. Transient API failures that outlast
`--retry-for` do not end an overnight keeper: it says so once and tries again at the next poll; a newer word of the
user (`pod down`, `pod stop`, a newer keep) ends it without another action.
"""

from __future__ import annotations

import os
import signal
import time

from podguard import console
from podguard.outcome_lines import Checkpoint, newest_checkpoint
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.actuate import Actuator
from podguard.pods.keeper.decide import Act, Decision, JobView, Observed, Outcome, decide
from podguard.pods.keeper.ending import TRANSIENT, KeepResult
from podguard.pods.keeper.events import Events
from podguard.pods.keeper.fence import Fence, Superseded
from podguard.pods.keeper.intent import Intent, Word
from podguard.pods.keeper.interrupt import Interrupted, signals_raise
from podguard.pods.keeper.kept import Kept
from podguard.pods.keeper.lines import CueKind, read_line
from podguard.pods.keeper.options import KeepOptions
from podguard.pods.keeper.reconcile import Reconciling
from podguard.pods.keeper.record import KeepState, KeepStore
from podguard.pods.keeper.recovery import FAST_WINDOW_S
from podguard.pods.pod import LogEvent, PodStatus
from podguard.pods.spec import PodSpec

__all__ = ["KeepOptions", "KeepResult", "Keeper"]


class Keeper(Reconciling):
    def __init__(
        self,
        target: Kept,
        store: KeepStore,
        options: KeepOptions,
        events: Events,
        *,
        spec: PodSpec,
        hands: Actuator,
        fence: Fence,
        previous: Intent | None = None,
    ) -> None:
        self.target, self.store, self.options, self.events, self.spec = target, store, options, events, spec
        self.hands, self.fence = hands, fence
        self.previous = previous  # the record before this keep's own word (a keep the user ended is not resumed)
        self.adopted = tuple(fence.mine.adopted)
        self.view = JobView()
        self.state = KeepState(name=spec.name, kind=target.kind)
        self.quiet_since: dict[int, float] = {}
        self.observed = Observed(PodStatus.PROVISIONING, cluster=target.kind == "cluster")
        self._incident: float | None = None  # when the recovery under way was decided (time.time())
        self._capacity_tries = 0
        self._outage = False
        self._fast_until = 0.0  # after a create or a recovery: poll at most recovery_poll_s apart until it runs
        self._booting_since = time.monotonic()  # the current start (create): `[ready] timeout_s` counts from it
        self.checkpoint: Checkpoint | None = None  # the newest checkpoint an END/RESTART line named
        self._told: set[str] = set()
        self._fresh = True

    # -- the whole run -------------------------------------------------------------------------------------
    def run(self) -> KeepResult:
        try:
            with signals_raise():
                return self._begin() or self._loop()
        except (KeyboardInterrupt, Interrupted) as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            over = self._word_now()
            if over is not None:  # `pod down` / `pod stop` (or a newer keep) ended it: said, and not resumed later
                self.state.phase, self.state.outcome = "done", over
            self.store.save(self.state)
            text = f"keeper ended by {signal.Signals(signum).name}: {self.target.describe()} is left as it is; " + (
                f"the keep is over ({over})" if over else "`podguard pod keep` again resumes where this one left off"
            )
            self.events.say(over or "interrupted", text)
            return KeepResult(128 + signum, "interrupted", text, self.state)
        except Superseded as exc:
            return self._superseded(exc)
        finally:
            self.target.close()

    def _word_now(self) -> str | None:
        """After a signal: the user's newer word that ended this keep (down, stopped, taken-over), if the record
        can be read at once; None otherwise (the keep may resume)."""
        try:
            current = self.fence.store.read()
        except Exception:  # a signal's way out reads the record once, best effort: nothing may stop the exit
            return None
        if current is None or (current.gen == self.fence.mine.gen and current.keep == self.fence.mine.keep):
            return None
        return {Word.DOWN: "down", Word.STOPPED: "stopped", Word.DONE: "done"}.get(current.word, "taken-over")

    def _begin(self) -> KeepResult | None:
        """Resume what the state file says (recoveries, where each log was read), else begin afresh; what exists
        is read at the first poll, never assumed."""
        self._fast_until = time.monotonic() + FAST_WINDOW_S  # until it runs, poll as `pod up` does
        self._booting_since = time.monotonic()
        saved = self.store.load()
        if saved is not None and not saved.done and saved.kind == self.target.kind and self._same_keep(saved):
            self.state = saved
            self._mine()
            self._restore_view()
            self._fresh = False
            self.events.say(
                "resume",
                f"resuming (recoveries so far: {self.state.recoveries} of at most {self.options.max_recoveries})",
            )
            if self.state.phase == "ending":  # the job was over; its stop was not confirmed: make it now
                return self._complete_ending()
            if not self.state.made:  # the first `pod up` never finished: nothing was lost, make it now
                console.say(f"no {self.target.kind} named {self.spec.name} was made before: `pod up` now")
            return None
        self.state = KeepState(name=self.spec.name, kind=self.target.kind)
        self._mine()
        self.events.say("begin", f"keeping {self.target.kind} {self.spec.name}: `pod up`, then watching it")
        return None

    def _same_keep(self, saved: KeepState) -> bool:
        """The saved state is the keep the record still names (a keeper killed and started again), not one the user
        ended since (`pod down`, `pod stop`), one another keep took over, or a state only a claim wrote: only then is
        it resumed."""
        if not saved.gen:
            return False  # nothing of a keep yet: the claim noted its word's identity, no more
        before = self.previous
        return before is None or (before.word is Word.KEPT and saved.owns(before.keep))

    def _mine(self) -> None:
        self.state.pid = os.getpid()
        self.state.gen, self.state.keep_id = self.fence.mine.gen, self.fence.mine.keep
        self.state.claiming = ""
        self.store.save(self.state)

    def _restore_view(self) -> None:
        for rank, streak in self.state.streaks.items():
            self.view.node(int(rank)).streak = streak
        for rank, target in self.state.ran.items():  # seen running before this keeper was started again
            self.view.node(int(rank)).ran = bool(target) and target == self.state.target_id
        for rank, target in self.state.preflight.items():  # its preflight line came before the keeper was killed
            self.view.node(int(rank)).preflight = bool(target) and target == self.state.target_id
        self.view.primary = 0

    def _remember_view(self) -> None:
        """What the view knows that a keeper started again needs: the preflight streaks, which nodes ran."""
        tid = self.target.target_id
        self.state.streaks = {str(r): n.streak for r, n in self.view.nodes.items()}
        self.state.ran = {str(r): tid for r, n in self.view.nodes.items() if n.ran}
        self.state.preflight = {str(r): tid for r, n in self.view.nodes.items() if n.preflight}

    # -- watching ------------------------------------------------------------------------------------------
    def _loop(self) -> KeepResult:
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:
                result = self._poll_and_act()
                if result is not None:
                    return result
                next_poll = time.monotonic() + self._poll_interval()
                continue
            got = self.target.streams.get(next_poll - now)
            if got is None:
                continue
            rank, item = got
            if isinstance(item, ApiError):
                self._stream_failed(rank, item)
                continue
            if self._take(rank, item):
                result = self._act(self._decide())
                if result is not None:
                    return result
                next_poll = min(next_poll, time.monotonic() + self._poll_interval())  # a recovery polls sooner

    def _poll_interval(self) -> float:
        """`--poll`; after `pod up` or a recovery, until the pod runs, at most `recovery_poll_s`."""
        if time.monotonic() < self._fast_until and self.observed.status is not PodStatus.RUNNING:
            return min(self.options.poll_s, self.options.recovery_poll_s)
        return self.options.poll_s

    def _poll_and_act(self) -> KeepResult | None:
        if self.state.phase == "ending":  # the job is over; the stop did not go through yet: try it again
            return self._complete_ending()
        try:
            if self.state.phase == "replacing":  # a replacement an outage (or a kill) interrupted: finish it first
                self._finish_replacement(resumed=True)
            silent = {r for r, t in self.quiet_since.items() if time.monotonic() - t >= self.options.silence_s}
            got = self._converge(silent)
        except ApiError as exc:
            if exc.kind not in TRANSIENT:
                raise
            self._api_outage(exc)
            return None
        self._api_back()
        if got is None or isinstance(got, KeepResult):
            return got
        self.observed = got
        now = time.monotonic()
        for rank, node in got.nodes.items():
            self.quiet_since.setdefault(rank, now)
            if node.status is PodStatus.RUNNING and node.has_runtime:
                self.view.node(rank).ran = True
        self._show(got)
        self._remember_view()
        self.store.save(self.state)
        decision = self._decide()
        if decision.settle and decision.act is not Act.WAIT:
            self._drain(self.options.settle_s)
            decision = self._decide()
        return self._act(decision)

    def _decide(self) -> Decision:
        return decide(
            self.observed,
            self.view,
            now=time.monotonic(),
            quiet_since=self.quiet_since,
            silence_s=self.options.silence_s,
            booting_since=self._booting_since,
            ready_s=self.spec.ready_timeout_s,
        )

    def _drain(self, seconds: float, *, to_the_end: bool = False) -> None:
        """Read what the streams still hold for `seconds` (lines printed just before a pod stopped); stop at the
        first outcome unless `to_the_end` (the other nodes' END lines after a cluster node's failure)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            got = self.target.streams.get(left)
            if got is None:
                return
            rank, item = got
            if isinstance(item, ApiError):
                self._stream_failed(rank, item)
            elif self._take(rank, item) and self.view.outcome is not None and not to_the_end:
                return

    def _take(self, rank: int, event: LogEvent) -> bool:
        """One log line of node `rank`: remember where the stream is; True when it was a decisive line."""
        now = time.monotonic()
        self.quiet_since[rank] = now
        self.view.node(rank).ran = self.view.node(rank).lines = True  # a line: its container runs
        mark = self.state.nodes.get(str(rank))
        cue = read_line(event.line)
        if mark is not None and event.id and (cue is None or cue.kind is not CueKind.END):
            # an END line is not passed in the record: what it calls for (the stop, a replacement) is recorded only
            # when it is decided, so a keeper killed in between must read it again when it resumes
            mark.last_event_id = event.id
        if cue is None:
            return False
        if cue.kind in (CueKind.END, CueKind.RESTART):
            self.checkpoint = newest_checkpoint(cue.line) or self.checkpoint
        text = self.view.take(rank, cue, now)
        self._remember_view()
        if text is not None:
            where = f"node{rank}: " if self.target.kind == "cluster" else ""
            fields: dict[str, object] = {"line": cue.line, "rank": rank, "target": self.target.target_id}
            if cue.word == "PASS" and self._incident is not None:
                fields["after_s"] = round(time.time() - self._incident, 3)
                self._incident = None
            self.events.say(cue.kind.value, where + text, **fields)
        self.store.save(self.state)
        return True

    def _stream_failed(self, rank: int, error: ApiError) -> None:
        if error.kind in (ApiErrorKind.AUTH, ApiErrorKind.NO_BALANCE, ApiErrorKind.FORBIDDEN):
            raise error
        self.target.stream_lost(rank)
        console.say(f"the log stream of node{rank} ended ({error.message}); reopened at the next poll")

    def _api_outage(self, exc: ApiError) -> None:
        if not self._outage:
            self._outage = True
            self.events.say("api", f"the API does not answer ({exc.message}); trying again every poll")

    def _api_back(self) -> None:
        if self._outage:
            self._outage = False
            self.events.say("api", "the API answers again")

    def _show(self, observed: Observed) -> None:
        status = "gone" if observed.status is None else str(observed.status)
        job = "job running" if any(n.passed for n in self.view.nodes.values()) else "waiting for the preflight"
        if observed.status is not PodStatus.RUNNING:
            job = ""
        text = f"{self.target.describe()}: {status}" + (f", {job}" if job else "")
        text += f", recoveries {self.state.recoveries}/{self.options.max_recoveries}"
        quiet = [time.monotonic() - t for t in self.quiet_since.values()]
        live = f"last line {min(quiet):.0f}s ago" if quiet else ""
        self.events.watching(text, live)

    # -- acting --------------------------------------------------------------------------------------------
    def _act(self, decision: Decision) -> KeepResult | None:
        if decision.act is Act.WAIT or self.state.phase == "ending":
            return None
        if decision.act is Act.FINISH and decision.reason == Outcome.FAILED and self.target.kind == "cluster":
            # the other nodes' END lines still in flight first (a node that ended with the job is no lost peer),
            # then one fresh member listing: a failure that follows a lost peer is the host's, not the job's
            self._drain(self.options.settle_s, to_the_end=True)
            try:
                self.observed = self.target.observe(self.state, set(), members=True)
            except ApiError as exc:
                if exc.kind not in TRANSIENT:
                    raise
                self._api_outage(exc)
                return None  # decided again at the next poll, with the outcome still in view
            decision = self._decide()
        if decision.act is Act.FINISH:
            return self._finish(Outcome(decision.reason), decision.detail)  # a stop not confirmed: None, next poll
        try:
            return self._recover(decision)
        except ApiError as exc:
            if exc.kind not in TRANSIENT:
                raise
            self._api_outage(exc)
            return None

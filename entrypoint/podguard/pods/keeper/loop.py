"""The keeper's loop: `pod up`, then one status request per poll and one log stream per node, until the job is over.

    code = Keeper(target, store, options, events, spec=spec).run()

Each poll reads the status once; between polls the loop waits on the log streams, so a decisive line (an END
line, a verdict, the guard line) is acted on as it arrives. decide.py says what to do; this module does it,
records each step in the state file *before* it is requested (a keeper killed mid-step resumes it, never
repeats it), and tells each event (events.py); recovery.py starts and replaces, ending.py stops and ends (`done`
only once the stop is confirmed). Transient API failures that outlast `--retry-for` do not end an overnight
keeper: it says so once and tries again at the next poll. See docs/running-pods.md.
"""

from __future__ import annotations

import os
import signal
import time

from podguard.outcome_lines import Checkpoint, newest_checkpoint
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.decide import Act, Decision, JobView, Observed, Outcome, decide
from podguard.pods.keeper.ending import TRANSIENT, KeepResult
from podguard.pods.keeper.events import Events
from podguard.pods.keeper.interrupt import Interrupted, held, signals_raise
from podguard.pods.keeper.lines import CueKind, read_line
from podguard.pods.keeper.options import KeepOptions
from podguard.pods.keeper.record import KeepState, KeepStore
from podguard.pods.keeper.recovery import FAST_WINDOW_S, Recovering
from podguard.pods.keeper.target import Target
from podguard.pods.model import LogEvent, PodStatus
from podguard.pods.spec import PodSpec

__all__ = ["KeepOptions", "KeepResult", "Keeper"]


class Keeper(Recovering):
    def __init__(
        self, target: Target, store: KeepStore, options: KeepOptions, events: Events, *, spec: PodSpec
    ) -> None:
        self.target, self.store, self.options, self.events, self.spec = target, store, options, events, spec
        self.view = JobView()
        self.state = KeepState(name=spec.name, kind=target.kind)
        self.quiet_since: dict[int, float] = {}
        self.observed = Observed(PodStatus.PROVISIONING, cluster=target.kind == "cluster")
        self._incident: float | None = None  # when the recovery under way was decided (time.time())
        self._capacity_tries = 0
        self._outage = False
        self._fast_until = 0.0  # after a recovery: poll at most recovery_poll_s apart until the pod runs
        self._booting_since = time.monotonic()  # the current start (create): `[ready] timeout_s` counts from it
        self.checkpoint: Checkpoint | None = None  # the newest checkpoint an END/RESTART line named

    # -- the whole run -------------------------------------------------------------------------------------
    def run(self) -> KeepResult:
        try:
            with signals_raise():
                return self._begin() or self._loop()
        except (KeyboardInterrupt, Interrupted) as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            self.store.save(self.state)
            text = (
                f"keeper ended by {signal.Signals(signum).name}: {self.target.describe()} is left as it is; "
                "`podguard pod keep` again resumes where this one left off"
            )
            self.events.say("interrupted", text)
            return KeepResult(128 + signum, "interrupted", text, self.state)
        finally:
            self.target.close()

    def _begin(self) -> KeepResult | None:
        """Resume what the state file says is kept, else do what `pod up` does (without its wait)."""
        self._fast_until = time.monotonic() + FAST_WINDOW_S  # until it runs, poll as `pod up` does
        self._booting_since = time.monotonic()
        saved = self.store.load()
        if saved is not None and not saved.done and saved.kind == self.target.kind:
            self.state = saved
            self.state.pid = os.getpid()
            self.store.save(self.state)  # `pod down` reads the live keeper's pid from here
            self._restore_view()
            self.events.say(
                "resume",
                f"resuming (recoveries so far: {self.state.recoveries} of at most {self.options.max_recoveries})",
            )
            if self.state.phase == "ending":  # the job was over; its stop was not confirmed: make it now
                return self._complete_ending()
            if self.state.phase == "replacing":
                self._finish_replacement(resumed=True)
            elif self.target.adopt(prefer=saved.target_id):  # several of the name (another actor mid-way): ours
                same = "the one kept before" if self.target.target_id == saved.target_id else "a new one"
                self.events.note(f"{self.target.describe()} exists ({same})")
            elif not saved.target_id:  # the first `pod up` never finished: nothing was lost, make it now
                self.events.note(f"no {self.target.kind} named {self.spec.name} was made before: `pod up` now")
                return self._up()
            else:
                self.events.note(f"no {self.target.kind} named {self.spec.name} exists now")
            self._remember_target()
            return None
        self.state = KeepState(name=self.spec.name, kind=self.target.kind, pid=os.getpid())
        self.store.save(self.state)
        self.events.say("begin", f"keeping {self.target.kind} {self.spec.name}: `pod up`, then watching it")
        return self._up()

    def _up(self) -> KeepResult | None:
        """What `pod up` does (without its wait), waiting for capacity; a pod whose host is full is replaced."""
        while True:
            try:
                with held():  # a `pod down` meanwhile: the create's answer first, so that `down` finds the pod
                    action = self.target.up(self.events.note)
                    self._remember_target()
                break
            except ApiError as exc:
                if exc.kind is not ApiErrorKind.NO_CAPACITY:
                    raise
                if self.target.adopt():  # it exists: its host is full on start
                    self._remember_target()
                    reason = f"its host has no free GPUs to start it ({exc.detail or exc.message})"
                    return self._recover(Decision(Act.REPLACE, reason))
                self._wait_for_capacity(exc)
        self._capacity_tries = 0
        mine = self.target.settle_twins() if action == "created" else ""
        if mine:
            action = (
                f"created, but another of the name was made at the same moment: the older is kept, {mine} terminated"
            )
        adopted = action in ("reused", "started") or bool(mine)
        text = f"{self.target.describe()}: {action} (as `pod up` does)"
        if adopted:
            text += ": it existed already (whoever made it), adopted, not duplicated"
        self.events.say("up", text, notify=adopted, target=self.target.target_id)
        self._remember_target()
        return None

    def _restore_view(self) -> None:
        for rank, streak in self.state.streaks.items():
            self.view.node(int(rank)).streak = streak
        for rank, target in self.state.ran.items():  # seen running before this keeper was started again
            self.view.node(int(rank)).ran = bool(target) and target == self.state.target_id
        self.view.primary = 0

    def _remember_view(self) -> None:
        """What the view knows that a keeper started again needs: the preflight streaks, which nodes ran."""
        self.state.streaks = {str(r): n.streak for r, n in self.view.nodes.items()}
        self.state.ran = {str(r): self.target.target_id for r, n in self.view.nodes.items() if n.ran}

    def _remember_target(self) -> None:
        self.state.target_id = self.target.target_id
        self.store.save(self.state)

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
        if self.state.phase == "replacing":  # a replacement that an API outage interrupted: finish it first
            try:
                self._finish_replacement(resumed=True)
            except ApiError as exc:
                if exc.kind not in TRANSIENT:
                    raise
                self._api_outage(exc)
                return None
        silent = {r for r, t in self.quiet_since.items() if time.monotonic() - t >= self.options.silence_s}
        try:
            observed = self._observe(silent)
        except ApiError as exc:
            if exc.kind not in TRANSIENT:
                raise
            self._api_outage(exc)
            return None
        self._api_back()
        self.observed = observed
        now = time.monotonic()
        for rank, node in observed.nodes.items():
            self.quiet_since.setdefault(rank, now)
            if node.status is PodStatus.RUNNING and node.has_runtime:
                self.view.node(rank).ran = True
        self._show(observed)
        self._remember_view()
        self.store.save(self.state)
        decision = self._decide()
        if decision.settle and decision.act is not Act.WAIT:
            self._drain(self.options.settle_s)
            decision = self._decide()
        return self._act(decision)

    def _observe(self, silent: set[int]) -> Observed:
        if not self.target.target_id:
            return Observed(None, cluster=self.target.kind == "cluster")
        return self.target.poll(self.state, silent)

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
        self.quiet_since[rank] = time.monotonic()
        self.view.node(rank).ran = True  # a line: its container runs
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
        text = self.view.take(rank, cue)
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
        self.events.note(f"the log stream of node{rank} ended ({error.message}); reopened at the next poll")

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
                self.observed = self.target.poll(self.state, set(), members=True)
            except ApiError as exc:
                if exc.kind not in TRANSIENT:
                    raise
                self._api_outage(exc)
                return None  # decided again at the next poll, with the outcome still in view
            decision = self._decide()
        if decision.act is Act.FINISH:
            return self._finish(Outcome(decision.reason))  # a stop that fails for a moment: None, tried next poll
        try:
            return self._recover(decision)
        except ApiError as exc:
            if exc.kind not in TRANSIENT:
                raise
            self._api_outage(exc)
            return None

"""The cluster gate over torch's TCPStore (the store torchrun itself uses): node 0 hosts, every node reports.

    outcome = run_gate(settings, verdict, stop=threading.Event(), on_decision=print_summary)

Keys live under a fresh session token that node 0 draws when it opens the store, so a node never reads
what an earlier attempt wrote:

    podguard/cluster-gate/session              node 0's token for this attempt
    .../<session>/verdict/<rank>               each node's NodeVerdict (JSON)
    .../<session>/reported, .../failed         counters (add), bumped after the verdict is stored
    .../<session>/decision                     node 0's decision (JSON): every node follows it
    .../<session>/acked                        counter: a node read the decision (node 0 may then close)

Node 0 decides as soon as every node passed (launch), one failed (76) or the timeout passed (75). The
others block in the store's own `wait` on the decision key, so they hear it one round trip after node 0
wrote it. torch is imported here, on a multi-node run only. Design notes: docs/clusters-in-node.md.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from podguard.errors import ExitCode, UsageError
from podguard.launch.multinode.verdicts import (
    GateOutcome,
    GateSettings,
    NodeVerdict,
    decision_from_json,
    decision_to_json,
)

__all__ = ["ROOT", "load_store_class", "run_gate"]

ROOT = "podguard/cluster-gate"
SESSION_KEY = f"{ROOT}/session"
POLL_S = 0.01  # node 0 polls its own in-process store (a local round trip)
RETRY_S = 0.1  # a node retries connecting to node 0 this often
WAIT_STEP_S = 0.5  # a blocking store wait is cut into steps so that a stop request is seen
OP_TIMEOUT_S = 10.0  # one store operation (connect included, once the port answered)
BIND_RETRY_S = 5.0  # node 0 retries a port in use this long before giving up (64)
ACK_WAIT_S = 10.0  # node 0 keeps the store up for the others to read a decision, at most this long
TELL_LATE_S = 30.0  # after a failure, node 0 stays up this long for nodes that had not reported yet

OnDecision = Callable[[GateOutcome], None]


def load_store_class() -> Any:
    """torch's TCPStore, imported quietly (no C++ warnings for refused connects, no NumPy warning)."""
    saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
    if saved is None:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"  # read once, when torch loads; the workers never see it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.distributed import TCPStore  # noqa: PLC0415  lazy: torch's TCPStore: a multi-node launch has torch, the gate's import does not need it
    except ImportError as exc:
        raise UsageError(f"the cluster gate needs PyTorch's torch.distributed in this Python ({exc})") from None
    finally:
        if saved is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    return TCPStore


def _key(session: str, *parts: object) -> str:
    return "/".join([ROOT, session, *map(str, parts)])


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(seconds, 0.001))


def _errors() -> tuple[type[BaseException], type[BaseException]]:
    """(timeout, any store failure): torch's DistStoreError for a wait that timed out, RuntimeError else."""
    from torch.distributed import DistStoreError  # noqa: PLC0415  lazy: torch's TCPStore: a multi-node launch has torch, the gate's import does not need it

    return DistStoreError, RuntimeError


class _Gate:
    """State shared by the host (node 0) and the joining nodes."""

    def __init__(self, settings: GateSettings, verdict: NodeVerdict, stop: threading.Event, on_decision: OnDecision):
        self.settings = settings
        self.verdict = verdict
        self.stop = stop
        self.on_decision = on_decision
        self.TCPStore = load_store_class()
        self.timeout_error, self.store_error = _errors()
        self.started = time.monotonic()
        self.deadline = self.started + settings.timeout_s
        self.published_at: float | None = None
        self.published_mono: float | None = None
        self.notes: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def outcome(
        self, code: int, failed: tuple[NodeVerdict, ...] = (), missing: tuple[int, ...] = (), detail: str = ""
    ) -> GateOutcome:
        waited = time.monotonic() - (self.published_mono or self.started)
        return GateOutcome(
            code=code,
            nnodes=self.settings.nnodes,
            node_rank=self.settings.node_rank,
            failed=failed,
            missing=missing,
            waited_s=waited,
            published_at=self.published_at,
            decided_at=time.time(),
            detail=detail,
        )

    def publish(self, store: Any, session: str) -> None:
        rank = self.verdict.rank
        store.set(_key(session, "verdict", rank), self.verdict.to_json())
        if not self.verdict.passed:
            store.add(_key(session, "failed"), 1)
        store.add(_key(session, "reported"), 1)
        self.published_at, self.published_mono = time.time(), time.monotonic()

    def present(self, store: Any, session: str) -> dict[int, NodeVerdict]:
        found = {}
        for rank in range(self.settings.nnodes):
            key = _key(session, "verdict", rank)
            if store.check([key]):
                found[rank] = NodeVerdict.from_json(store.get(key))
        return found

    def own_code(self, decided: int) -> int:
        """A node that failed its own preflight exits with its own code; the others with the decision's."""
        return decided if self.verdict.passed else self.verdict.code


# --------------------------------------------------------------------------------------------------
# node 0


def _listen(settings: GateSettings, deadline: float, stop: threading.Event) -> socket.socket:
    """A listening socket on every address (IPv6 dual-stack where there is IPv6); a port in use is retried
    for a few seconds, then refused (64) naming the port and PODGUARD_CLUSTER_PORT."""
    until = min(deadline, time.monotonic() + BIND_RETRY_S)
    while True:
        try:
            return _bind(settings.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise UsageError(f"the cluster gate cannot listen on port {settings.port}: {exc.strerror}") from None
            if time.monotonic() >= until or stop.wait(RETRY_S):
                raise UsageError(
                    f"the cluster gate's port {settings.port} is in use on node 0; set PODGUARD_CLUSTER_PORT to a "
                    "free port, the same on every node (default: PRIMARY_PORT + 1)"
                ) from None


def _bind(port: int) -> socket.socket:
    families = [(socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")] if socket.has_ipv6 else []
    families = families or [(socket.AF_INET, "0.0.0.0")]
    last: OSError | None = None
    for family, any_addr in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # no IPv6 in this kernel
            last = exc
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a previous attempt's TIME_WAIT
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((any_addr, port))
            sock.listen(512)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise
            last = exc
    assert last is not None
    raise last


class _Host(_Gate):
    """Node 0: hosts the store, decides, and stays up until the others have read the decision."""

    def run(self) -> GateOutcome | None:
        store = self._open()
        try:
            session = secrets.token_hex(8)
            store.set(SESSION_KEY, session)
            self.publish(store, session)
            verdicts = self._collect(store, session)
            if verdicts is None:
                return None  # stopped
            outcome = self._decide(store, session, verdicts)
            self.on_decision(outcome)
            self._linger(store, session, outcome)
            return outcome
        finally:
            del store  # the server thread stops with the object: a restarted node finds no stale store

    def _open(self) -> Any:
        """The store, on a socket bound here first: a port in use is then a clear error, not a C++ one."""
        sock = _listen(self.settings, self.deadline, self.stop)
        loopback = "127.0.0.1"  # the host's own client connection (a dual-stack socket takes IPv4 too)
        options = {"timeout": _timedelta(OP_TIMEOUT_S), "wait_for_workers": False}
        try:
            store = self.TCPStore(loopback, self.settings.port, None, True, master_listen_fd=sock.fileno(), **options)
        except (TypeError, RuntimeError):  # a torch whose store cannot take a socket (before 2.8 with libuv):
            sock.close()  # let it bind the (now free) port itself
            return self.TCPStore(loopback, self.settings.port, None, True, **options)
        except BaseException:
            sock.close()
            raise
        sock.detach()  # the store owns the descriptor now
        return store

    def _collect(self, store: Any, session: str) -> dict[int, NodeVerdict] | None:
        """Wait until every node reported, one failed, or the timeout passed; the verdicts present then."""
        seen = -1
        verdicts: dict[int, NodeVerdict] = {}
        while True:
            reported = store.add(_key(session, "reported"), 0)
            if store.add(_key(session, "failed"), 0) > 0:
                return self.present(store, session)
            if reported != seen:
                seen = reported
                if reported >= self.settings.nnodes:
                    verdicts = self.present(store, session)
                    if len(verdicts) == self.settings.nnodes:
                        return verdicts
            if self.left() <= 0:
                return self.present(store, session)
            if self.stop.wait(POLL_S):
                return None

    def _decide(self, store: Any, session: str, verdicts: dict[int, NodeVerdict]) -> GateOutcome:
        failed = [v for _, v in sorted(verdicts.items()) if not v.passed]
        missing = [r for r in range(self.settings.nnodes) if r not in verdicts]
        code = ExitCode.GPU_UNHEALTHY if failed else ExitCode.GPUS_BUSY if missing else ExitCode.OK
        store.set(_key(session, "decision"), decision_to_json(code=code, failed=failed, missing=missing))
        return self.outcome(self.own_code(code), tuple(failed), tuple(missing))

    def _linger(self, store: Any, session: str, outcome: GateOutcome) -> None:
        """Keep the store until every other node acknowledged the decision: briefly after a launch decision,
        longer after a failure (late nodes learn it instead of waiting for --cluster-timeout)."""
        others = self.settings.nnodes - 1
        if outcome.launch or not outcome.failed:
            until = time.monotonic() + ACK_WAIT_S
        elif not self.verdict.passed:
            until = self.deadline  # this node failed: it has nothing better to do than tell the others
        else:
            until = min(self.deadline, time.monotonic() + TELL_LATE_S)
        while store.add(_key(session, "acked"), 0) < others and time.monotonic() < until:
            if self.stop.wait(POLL_S):
                return


# --------------------------------------------------------------------------------------------------
# nodes 1..N-1


class _Joiner(_Gate):
    """A node other than 0: connects (node 0 may start later), reports, waits for node 0's decision."""

    def run(self) -> GateOutcome | None:
        stale_said = False
        store = None
        session = ""
        while not self.stop.is_set():
            if self.left() <= 0:
                return self._timed_out(store, session)
            store = self._connect()
            if store is None:
                continue
            try:
                session = self._session(store)
                if session is None:
                    store = None
                    continue
                decision = _key(session, "decision")
                if store.check([decision]):  # decided before this node reported: an earlier attempt's
                    code, failed, missing = decision_from_json(store.get(decision))
                    if code != ExitCode.OK:  # that attempt failed: so does this one (every node exits)
                        store.add(_key(session, "acked"), 1)
                        others = tuple(r for r in missing if r != self.settings.node_rank)
                        own = () if self.verdict.passed else (self.verdict,)
                        return self.outcome(self.own_code(code), (*failed, *own), others)
                    if not stale_said:
                        self.notes.append("node 0's store still holds an earlier attempt; waited for a new one")
                        stale_said = True
                    store = None
                    self.stop.wait(RETRY_S * 2)
                    continue
                self.publish(store, session)
                if not self.verdict.passed:
                    store.add(_key(session, "acked"), 1)  # nothing to wait for: this node will not launch
                    return self.outcome(self.verdict.code, (self.verdict,), ())
                got = self._await_decision(store, decision)
                if got is None:
                    continue  # stopped, or the deadline: the loop head decides
                store.add(_key(session, "acked"), 1)
                code, failed, missing = decision_from_json(got)
                return self.outcome(self.own_code(code), failed, missing)
            except self.store_error:  # node 0 went away (restarted?): connect again, report again
                store = None
                self.stop.wait(RETRY_S)
        return None

    def _connect(self) -> Any:
        """A store client once node 0's port answers; None (after a short pause) while it does not."""
        s = self.settings
        try:
            with socket.create_connection((s.addr, s.port), timeout=min(1.0, max(self.left(), 0.05))):
                pass
        except OSError:
            self.stop.wait(RETRY_S)
            return None
        try:
            timeout = _timedelta(min(OP_TIMEOUT_S, max(self.left(), 0.5)))
            return self.TCPStore(s.addr, s.port, None, False, timeout=timeout, wait_for_workers=False)
        except self.store_error:
            self.stop.wait(RETRY_S)
            return None

    def _session(self, store: Any) -> str | None:
        try:
            store.wait([SESSION_KEY], _timedelta(min(2.0, max(self.left(), 0.05))))
        except self.timeout_error:
            return None
        value = store.get(SESSION_KEY)
        return value.decode() if isinstance(value, bytes) else str(value)

    def _await_decision(self, store: Any, key: str) -> bytes | None:
        while not self.stop.is_set() and self.left() > 0:
            try:
                store.wait([key], _timedelta(min(WAIT_STEP_S, self.left())))
                return store.get(key)
            except self.timeout_error:
                continue
        return None

    def _timed_out(self, store: Any, session: str) -> GateOutcome:
        timeout = self.settings.timeout_s
        if store is None or not session:
            detail = f"node 0's store at {self.settings.endpoint} did not answer within {timeout:g} s"
            missing = tuple(r for r in range(self.settings.nnodes) if r != self.settings.node_rank)
            return self.outcome(ExitCode.GPUS_BUSY, (), missing, detail)
        with contextlib.suppress(self.store_error):
            present = self.present(store, session)
            missing = tuple(r for r in range(self.settings.nnodes) if r not in present and r != self.verdict.rank)
            failed = tuple(v for v in present.values() if not v.passed)
            return self.outcome(ExitCode.GPU_UNHEALTHY if failed else ExitCode.GPUS_BUSY, failed, missing)
        missing = tuple(r for r in range(self.settings.nnodes) if r != self.settings.node_rank)
        return self.outcome(ExitCode.GPUS_BUSY, (), missing, "lost node 0's store")


def run_gate(
    settings: GateSettings, verdict: NodeVerdict, *, stop: threading.Event, on_decision: OnDecision
) -> GateOutcome | None:
    """This node's part of the gate (see the module docstring). None when `stop` was set first.
    Raises UsageError (64) for a port node 0 cannot listen on or a missing torch."""
    gate_class = _Host if settings.hosts else _Joiner
    gate = gate_class(settings, verdict, stop, on_decision)
    outcome = gate.run()
    if outcome is not None and gate.notes:
        outcome = replace(outcome, notes=(*outcome.notes, *gate.notes))
    return outcome

"""What the cluster gate exchanges and decides, and how its result is told to a person.

    settings = gate_settings(rdzv, cluster_port=None, timeout_s=600.0)   # PRIMARY_ADDR, PRIMARY_PORT + 1
    verdict = NodeVerdict(rank=1, word="UNHEALTHY", code=76, reasons=("UNHEALTHY GPU 0: ECC ...",))
    print(format_gate_summary(outcome))                                  # "podguard cluster gate: ..."

Plain data and text only: no torch, no sockets (the store protocol is `protocol.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from podguard.errors import ExitCode, UsageError

__all__ = [
    "DEFAULT_CLUSTER_TIMEOUT_S",
    "GateOutcome",
    "GateSettings",
    "NodeVerdict",
    "decision_from_json",
    "decision_to_json",
    "format_gate_summary",
    "gate_settings",
]

DEFAULT_CLUSTER_TIMEOUT_S = 600.0
SUMMARY_HEAD = "podguard cluster gate:"  # not `podguard <command>: VERDICT`: the preflight's line stays the one


@dataclass(frozen=True)
class GateSettings:
    """Where the gate meets (node 0 hosts the store) and how long a node waits for the others."""

    nnodes: int
    node_rank: int
    addr: str  # PRIMARY_ADDR: node 0's address on the cluster network
    port: int  # PODGUARD_CLUSTER_PORT, default PRIMARY_PORT + 1
    timeout_s: float  # --cluster-timeout

    @property
    def hosts(self) -> bool:
        return self.node_rank == 0

    @property
    def endpoint(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr and not self.addr.startswith("[") else self.addr
        return f"{host}:{self.port}"


def gate_settings(
    *, nnodes: int, node_rank: int, addr: str, rdzv_port: int, cluster_port: int | None, timeout_s: float
) -> GateSettings:
    """The gate's settings from the rendezvous; the store port defaults to the rendezvous port + 1."""
    port = cluster_port if cluster_port is not None else rdzv_port + 1
    if not 1 <= port <= 65535:
        raise UsageError(
            f"the cluster gate's port would be PRIMARY_PORT + 1 = {port}, which is not a TCP port; "
            "set PODGUARD_CLUSTER_PORT to a free port in 1..65535 (the same on every node)"
        )
    if cluster_port is not None and cluster_port == rdzv_port:
        raise UsageError(
            f"PODGUARD_CLUSTER_PORT={cluster_port} is the rendezvous port (PRIMARY_PORT/MASTER_PORT) itself; "
            "choose another free port (default: PRIMARY_PORT + 1)"
        )
    return GateSettings(nnodes=nnodes, node_rank=node_rank, addr=addr, port=port, timeout_s=timeout_s)


@dataclass(frozen=True)
class NodeVerdict:
    """One node's preflight verdict as published in the store."""

    rank: int
    word: str  # PASS, BUSY, UNHEALTHY, FAIL (the preflight summary's verdict word)
    code: int  # the preflight's exit code
    reasons: tuple[str, ...] = ()  # "UNHEALTHY GPU 0: ...", or "FAIL: <message>"
    host: str = ""

    @property
    def passed(self) -> bool:
        return self.code == ExitCode.OK

    def to_json(self) -> str:
        return json.dumps(
            {"rank": self.rank, "word": self.word, "code": self.code, "reasons": list(self.reasons), "host": self.host}
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeVerdict:
        data = json.loads(text)
        return cls(
            rank=int(data["rank"]),
            word=str(data["word"]),
            code=int(data["code"]),
            reasons=tuple(str(r) for r in data.get("reasons", [])),
            host=str(data.get("host", "")),
        )

    def lines(self) -> list[str]:
        """`node 1: UNHEALTHY GPU 0: ...`, one line per reason (at least one)."""
        return [f"node {self.rank}: {reason}" for reason in self.reasons] or [f"node {self.rank}: {self.word}"]


@dataclass(frozen=True)
class GateOutcome:
    """How the gate ended for this node. `code` 0: launch; otherwise exit with it."""

    code: int
    nnodes: int
    node_rank: int
    failed: tuple[NodeVerdict, ...] = ()  # the nodes that failed their preflight (this one included)
    missing: tuple[int, ...] = ()  # ranks that had not reported when the gate was decided
    waited_s: float = 0.0  # from this node's verdict to the decision
    published_at: float | None = None  # epoch seconds: this node's verdict was in the store
    decided_at: float | None = None  # epoch seconds: this node knew the decision
    detail: str = ""  # a line about how it was decided (timeouts, a stale store, a signal)
    notes: tuple[str, ...] = field(default_factory=tuple)  # extra lines for the summary (the socket interface)

    @property
    def launch(self) -> bool:
        return self.code == ExitCode.OK

    def to_data(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "nodes": self.nnodes,
            "node_rank": self.node_rank,
            "failed": [json.loads(v.to_json()) for v in self.failed],
            "missing": list(self.missing),
            "waited_s": round(self.waited_s, 3),
            "published_at": self.published_at,
            "decided_at": self.decided_at,
            "detail": self.detail,
        }


def decision_to_json(*, code: int, failed: list[NodeVerdict], missing: list[int]) -> str:
    """What node 0 writes as the decision every node follows."""
    return json.dumps({"code": code, "failed": [json.loads(v.to_json()) for v in failed], "missing": missing})


def decision_from_json(text: str | bytes) -> tuple[int, tuple[NodeVerdict, ...], tuple[int, ...]]:
    data = json.loads(text)
    failed = tuple(NodeVerdict.from_json(json.dumps(v)) for v in data.get("failed", []))
    return int(data["code"]), failed, tuple(int(r) for r in data.get("missing", []))


def _ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(str(r) for r in ranks)


def format_gate_summary(outcome: GateOutcome, *, timeout_s: float | None = None) -> str:
    """A few lines, the failing and missing nodes named. Not matched by `pod up`'s verdict pattern (the
    preflight's own `podguard train: PASS` line is the node's readiness); the gate line follows it."""
    where = f"node {outcome.node_rank} of {outcome.nnodes}"
    if outcome.launch:
        head = f"{SUMMARY_HEAD} PASS: all {outcome.nnodes} nodes passed their preflight ({where}"
        head += f", waited {outcome.waited_s:.1f} s for the others)" if outcome.waited_s >= 0.05 else ")"
        lines = [head]
    elif outcome.code >= ExitCode.SIGNAL_BASE:
        lines = [f"{SUMMARY_HEAD} STOPPED ({where}): {outcome.detail or 'a signal ended the wait'}; not launching"]
    else:
        own = any(v.rank == outcome.node_rank for v in outcome.failed)
        if outcome.failed:
            who = _ranks(tuple(v.rank for v in outcome.failed))
            what = "this node failed its preflight" if own and len(outcome.failed) == 1 else f"node(s) {who} failed"
            lines = [f"{SUMMARY_HEAD} FAIL ({where}): {what}; no node launches"]
        else:
            within = f" within {timeout_s:g} s (--cluster-timeout)" if timeout_s is not None else ""
            lines = [
                f"{SUMMARY_HEAD} FAIL ({where}): node(s) {_ranks(outcome.missing)} did not report{within}; "
                "no node launches"
            ]
        for verdict in outcome.failed:
            lines += [f"  {line}" for line in verdict.lines()]
        if outcome.failed and outcome.missing:
            lines.append(f"  not reported yet: node(s) {_ranks(outcome.missing)}")
        if outcome.detail:
            lines.append(f"  {outcome.detail}")
    lines += [f"  {note}" for note in outcome.notes]
    return "\n".join(lines)

"""The keeper's memory in the state dir: where it stands, and a record of every event.

    store = KeepStore.open("llm-train")            # <state dir>/keep/llm-train.json (+ .events.jsonl, .lock)
    state = store.load()                           # None: nothing kept under this name yet
    store.save(state)                              # atomic, owner-only; a failed write is one warning
    store.event("recovery", "EXITED without an outcome: starting it", pod="abc123")

A keeper killed and started again picks up from the state file: the pod or cluster it keeps, the recoveries so
far, and per node the start it follows and the last log event it read (the stream resumes after it with
`Last-Event-ID`). The state is a convenience, never the truth: what exists is read from the API each poll
(converge.py), and the user's word from the keep's record (intent_store.py). So a write that fails (a full disk)
is one warning and the keeper goes on in memory: its own fault must never leave a pod billing. The lock makes one
keeper per state dir; registry.py makes one per machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from podguard import console
from podguard.errors import PodguardError, UsageError
from podguard.redact import redact_text
from podguard.state import NoFlock, open_lock, state_dir, subdir, try_flock, write_private

__all__ = ["KeepState", "KeepStore", "NodeMark", "iso_now", "safe_name"]

STATE_VERSION = 1


def iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def safe_name(name: str) -> str:
    """A file name for a pod name (RunPod names may hold spaces and slashes)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "pod"
    if cleaned != name:
        cleaned += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return cleaned[:200]


@dataclass
class NodeMark:
    """Where one node's log was read up to: its pod, the start followed, the last event id."""

    pod_id: str
    started_at: str | None = None
    last_event_id: str = ""


@dataclass
class KeepState:
    name: str
    kind: str  # pod | cluster
    target_id: str = ""  # the pod's or cluster's id ("" while there is none: a replacement is being made)
    recoveries: int = 0
    phase: str = "watching"  # watching | replacing | ending (the stop is not confirmed yet) | done
    outcome: str = ""  # success | guard | failed | gave-up | refused | down | stopped ("" while not done)
    code: int | None = None
    why: str = ""  # while ending: what ended it, in words (the end message, once the stop is confirmed)
    streaks: dict[str, int] = field(default_factory=dict)  # rank -> preflight verdicts other than PASS in a row
    ran: dict[str, str] = field(default_factory=dict)  # rank -> the target seen running its container (this start)
    nodes: dict[str, NodeMark] = field(default_factory=dict)  # rank -> where its log was read up to
    data_center: str = ""  # where the kept pod (cluster) last ran: a network volume pins its replacement there
    pid: int = 0  # the keeper process (a live one holds the lock)
    keeper_pod: str = ""  # set inside a deployed keeper: its own pod's name
    preflight: dict[str, str] = field(default_factory=dict)  # rank -> the target whose preflight line came (start)
    gen: int = 0  # the generation of the user's word this keeper acts for (the keep's record)
    keep_id: str = ""  # the keep's identity (in the record, and in the mark of what it makes)
    claiming: str = ""  # the identity of a word being written (a keeper killed in between: still its own)
    made: bool = False  # a pod (cluster) was kept before: none of the name now is a lost one, not a first create
    version: int = STATE_VERSION
    updated: str = field(default_factory=iso_now)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def owns(self, keep_id: str) -> bool:
        """`keep_id` (the record's) is this state's keep, or the one it was claiming when it was killed."""
        return bool(keep_id) and keep_id in (self.keep_id, self.claiming)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeepState:
        nodes = {str(k): NodeMark(**v) for k, v in (data.get("nodes") or {}).items()}
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "nodes"}
        return cls(**known, nodes=nodes)


class KeepStore:
    """The files of one kept name under `<state dir>/keep/`."""

    def __init__(self, folder: Path, name: str) -> None:
        self.name = name
        self._failing = False
        base = folder / safe_name(name)
        self.state_path = base.with_name(base.name + ".json")
        self.events_path = base.with_name(base.name + ".events.jsonl")
        self.lock_path = base.with_name(base.name + ".lock")
        self._lock_fd: int | None = None

    @classmethod
    def open(cls, name: str) -> KeepStore:
        return cls(subdir(state_dir(), "keep"), name)

    # -- the state ---------------------------------------------------------------------------------------
    def load(self) -> KeepState | None:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise UsageError(f"{self.state_path} cannot be read ({exc}); move it away to start afresh") from None
        try:
            return KeepState.from_json(data)
        except TypeError as exc:
            raise UsageError(f"{self.state_path} is not a keeper state ({exc}); move it away to start afresh") from None

    def save(self, state: KeepState) -> bool:
        """Write the state; a write that fails (a full disk, a read-only folder) is one warning, not the end of the
        keeper (it goes on in memory; the next save tries again). True when it was written."""
        state.updated = iso_now()
        try:
            write_private(self.state_path, json.dumps(state.to_json(), indent=2))
        except (OSError, PodguardError) as exc:
            if not self._failing:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                console.warn(f"cannot write the keeper's state {self.state_path} ({why}); it goes on in memory")
            self._failing = True
            return False
        if self._failing:
            console.say(f"the keeper's state is written again ({self.state_path})")
        self._failing = False
        return True

    # -- events ------------------------------------------------------------------------------------------
    def event(self, kind: str, text: str, **fields: Any) -> dict[str, Any]:
        """Append one event (a JSON line); best effort: a full disk must not stop the keeper."""
        entry = {"at": iso_now(), "t": round(time.time(), 3), "name": self.name, "event": kind, "text": text}
        entry.update({k: v for k, v in fields.items() if v is not None})
        line = redact_text(json.dumps(entry, default=str))
        with contextlib.suppress(OSError):
            fd = os.open(self.events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        return entry

    # -- one keeper per name -----------------------------------------------------------------------------
    def lock(self) -> bool:
        """Take the keeper lock of this name; False when another live keeper holds it."""
        fd = open_lock(self.lock_path)
        try:
            got = try_flock(fd)
        except NoFlock:
            got = True  # a filesystem without flock: one keeper per name is then the user's to keep
        if not got:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

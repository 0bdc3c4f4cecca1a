"""The user's word about a name, and the rules every actor applies to it (pure: no I/O; intent_store.py keeps it).

    said = spoken(current, Word.DOWN, by="pod down on laptop", at=iso_now())    # the next generation
    may_act(current, mine)           # a keeper may create, start, stop, terminate: the record is its own `kept`
    why_not(current, mine)           # "`pod down` (generation 7, by ... at ...) ended this keep"
    finished(current, mine, "success", 0)                                     # `done` over its own `kept`, or None

`pod keep` says `kept`, `pod down` says `down`, `pod stop` says `stopped`: each is a new generation (one more than
the record's), with the keep's identity for `kept`. A keeper acts only while the record is its own `kept` (the
same generation and identity): a newer word, whoever wrote it and wherever, ends it (a fence, read before every
action). The only word a keeper writes is `done`, over its own `kept` and never over a newer generation, so that a
keeper started again (a keeper pod whose container disk was reset) knows its keep is over. Adoptions (`--adopt`:
pods of the name the user handed to podguard) travel with every word.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = ["Intent", "Word", "finished", "is_over", "may_act", "new_keep_id", "spoken", "why_not"]


class Word(StrEnum):
    KEPT = "kept"  # `pod keep`: the keep `keep` may act
    DOWN = "down"  # `pod down`: nothing of the name may bill
    STOPPED = "stopped"  # `pod stop`: the pod is stopped, nothing starts it again
    DONE = "done"  # the keep `keep` ended (its outcome): nothing brings the job back


@dataclass(frozen=True)
class Intent:
    word: Word
    gen: int
    keep: str = ""  # the keep's identity (kept, done)
    by: str = ""  # who said it: "pod down on HOST (USER)"
    at: str = ""  # when (ISO 8601, UTC)
    adopted: tuple[str, ...] = ()  # ids the user handed to podguard with --adopt
    outcome: str = ""  # done: success | guard | failed | gave-up | refused | crash-loop
    code: int | None = None  # done: the keep's exit code
    extra: dict[str, str] = field(default_factory=dict)  # room for later fields, kept as read

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["word"] = str(self.word)
        data["adopted"] = list(self.adopted)
        return {k: v for k, v in data.items() if v not in ("", None, [], {})}  # (word and gen are never empty)

    @classmethod
    def from_json(cls, data: Any) -> Intent | None:
        """The intent in a record's JSON; None when it does not read as one (a record from elsewhere)."""
        if not isinstance(data, dict):
            return None
        try:
            word = Word(str(data.get("word")))
            gen = int(data.get("gen"))  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return None
        code = data.get("code")
        return cls(
            word=word,
            gen=gen,
            keep=str(data.get("keep") or ""),
            by=str(data.get("by") or ""),
            at=str(data.get("at") or ""),
            adopted=tuple(str(a) for a in data.get("adopted") or () if str(a)),
            outcome=str(data.get("outcome") or ""),
            code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            extra={str(k): str(v) for k, v in (data.get("extra") or {}).items()},
        )

    def describe(self) -> str:
        """`pod down (generation 7, by pod down on laptop, at 2026-...)`, in words."""
        what = {
            Word.KEPT: f"kept by keep {self.keep}",
            Word.DOWN: "taken down",
            Word.STOPPED: "stopped",
            Word.DONE: f"done ({self.outcome or 'ended'})",
        }[self.word]
        parts = (f"by {self.by}" if self.by else "", f"at {self.at}" if self.at else "")
        where = ", ".join(part for part in parts if part)
        return f"{what} (generation {self.gen}{', ' + where if where else ''})"


def new_keep_id(gen: int) -> str:
    """A keep's identity: its generation and a random part (two keeps never share one)."""
    return f"k{gen}-{secrets.token_hex(3)}"


def spoken(
    current: Intent | None, word: Word, *, by: str, at: str, keep: str = "", adopt: tuple[str, ...] = ()
) -> Intent:
    """The user's new word: the next generation, carrying the adoptions made so far (plus `adopt`)."""
    gen = (current.gen if current is not None else 0) + 1
    adopted = tuple(dict.fromkeys([*(current.adopted if current is not None else ()), *adopt]))
    return Intent(word, gen, keep if word is Word.KEPT else "", by, at, adopted)


def may_act(current: Intent | None, mine: Intent) -> bool:
    """A keeper acts (create, start, stop, terminate) only while the record is its own `kept`."""
    return current is not None and current.word is Word.KEPT and current.gen == mine.gen and current.keep == mine.keep


def is_over(current: Intent | None, mine: Intent) -> bool:
    """The keep `mine` is over for good: a newer word, or its own `done`. (None: no record can be read: not over,
    not allowed either; the keeper reads again.)"""
    if current is None:
        return False
    return current.gen > mine.gen or (current.gen == mine.gen and current.word is not Word.KEPT)


def why_not(current: Intent | None, mine: Intent) -> str:
    """Why the keep `mine` may not act, in words ("" when it may)."""
    if may_act(current, mine):
        return ""
    if current is None:
        return "the keep's record cannot be read"
    if current.gen < mine.gen:
        return f"the record went back to an older word ({current.describe()})"
    if current.gen == mine.gen and current.word is Word.KEPT:
        return f"another keep holds this generation ({current.describe()})"
    return f"the user's word changed: {current.describe()}"


def finished(current: Intent | None, mine: Intent, outcome: str, code: int, *, at: str) -> Intent | None:
    """`done` over the keep's own `kept` (same generation); None when the record holds anything else (a newer word
    stands: a keeper never writes over it)."""
    if not may_act(current, mine):
        return None
    assert current is not None
    return replace(current, word=Word.DONE, outcome=outcome, code=int(code), at=at)

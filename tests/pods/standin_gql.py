"""A strict parser for the GraphQL subset the `runpod` SDK sends (the stand-in API's request reader).

    op = parse_operation('mutation { podStop(input: {podId: "x"}) { id } }')
    op.kind == "mutation"; op.fields[0].name == "podStop"; op.fields[0].args == {"input": {"podId": "x"}}

Strict on purpose: a raw newline inside a string, an unbalanced quote or a stray brace is a syntax error,
exactly what a real GraphQL server answers when a client pastes values unescaped. String escapes follow the
spec (\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX, surrogate pairs joined).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class GqlSyntaxError(ValueError):
    pass


@dataclass
class Field:
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    selections: list[Field] = field(default_factory=list)


@dataclass
class Operation:
    kind: str
    fields: list[Field]


class Enum(str):
    """An enum value (unquoted name such as SECURE), distinct from a string."""


_PUNCT = set("{}()[]:,!$@=")


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n,\ufeff":
            i += 1
        elif ch == "#":
            while i < n and text[i] not in "\r\n":
                i += 1
        elif ch in _PUNCT:
            out.append(("p", ch))
            i += 1
        elif ch == '"':
            value, i = _string(text, i + 1)
            out.append(("s", value))
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            out.append(("n", text[i:j]))
            i = j
        elif ch.isdigit() or ch == "-":
            j = i + 1
            while j < n and (text[j].isdigit() or text[j] in ".eE+-"):
                j += 1
            raw = text[i:j]
            try:
                out.append(("v", float(raw) if any(c in raw for c in ".eE") else int(raw)))
            except ValueError:
                raise GqlSyntaxError(f"bad number {raw!r}") from None
            i = j
        else:
            raise GqlSyntaxError(f"unexpected character {ch!r} at {i}")
    return out


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _string(text: str, i: int) -> tuple[str, int]:
    if text.startswith('""', i):
        raise GqlSyntaxError("block strings are not part of this subset")
    units: list[str] = []
    while True:
        if i >= len(text):
            raise GqlSyntaxError("unterminated string")
        ch = text[i]
        if ch == '"':
            return _join_surrogates(units), i + 1
        if ch in "\r\n" or (ord(ch) < 0x20 and ch != "\t"):
            raise GqlSyntaxError(f"raw control character {ch!r} in a string")
        if ch == "\\":
            esc = text[i + 1 : i + 2]
            if esc == "u":
                hexpart = text[i + 2 : i + 6]
                if len(hexpart) != 4 or any(c not in "0123456789abcdefABCDEF" for c in hexpart):
                    raise GqlSyntaxError(f"bad unicode escape \\u{hexpart}")
                units.append(chr(int(hexpart, 16)))
                i += 6
                continue
            if esc not in _ESCAPES:
                raise GqlSyntaxError(f"bad escape \\{esc}")
            units.append(_ESCAPES[esc])
            i += 2
            continue
        units.append(ch)
        i += 1


def _join_surrogates(units: list[str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(units):
        code = ord(units[i])
        if 0xD800 <= code < 0xDC00 and i + 1 < len(units) and 0xDC00 <= ord(units[i + 1]) < 0xE000:
            out.append(chr(0x10000 + ((code - 0xD800) << 10) + (ord(units[i + 1]) - 0xDC00)))
            i += 2
            continue
        if 0xD800 <= code < 0xE000:
            raise GqlSyntaxError("lone surrogate escape")
        out.append(units[i])
        i += 1
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.pos = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self, kind: str, value: Any = None) -> Any:
        tok = self.peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            raise GqlSyntaxError(f"expected {value or kind}, got {tok}")
        self.pos += 1
        return tok[1]

    def at(self, kind: str, value: Any = None) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == kind and (value is None or tok[1] == value)

    def operation(self) -> Operation:
        kind = "query"
        if self.at("n") and self.peek()[1] in ("query", "mutation"):  # type: ignore[index]
            kind = self.take("n")
            if self.at("n"):
                self.take("n")
        fields = self.selection_set()
        if self.peek() is not None:
            raise GqlSyntaxError(f"unexpected {self.peek()} after the operation")
        return Operation(kind, fields)

    def selection_set(self) -> list[Field]:
        self.take("p", "{")
        fields = []
        while not self.at("p", "}"):
            fields.append(self.field())
        self.take("p", "}")
        return fields

    def field(self) -> Field:
        name = self.take("n")
        if self.at("p", ":"):  # alias
            self.take("p", ":")
            name = self.take("n")
        args: dict[str, Any] = {}
        if self.at("p", "("):
            self.take("p", "(")
            while not self.at("p", ")"):
                key = self.take("n")
                self.take("p", ":")
                args[key] = self.value()
            self.take("p", ")")
        selections = self.selection_set() if self.at("p", "{") else []
        return Field(name, args, selections)

    def value(self) -> Any:
        tok = self.peek()
        if tok is None:
            raise GqlSyntaxError("expected a value")
        kind, val = tok
        if kind == "s" or kind == "v":
            self.pos += 1
            return val
        if kind == "n":
            self.pos += 1
            return {"true": True, "false": False, "null": None}.get(val, Enum(val))
        if self.at("p", "["):
            self.take("p", "[")
            items = []
            while not self.at("p", "]"):
                items.append(self.value())
            self.take("p", "]")
            return items
        if self.at("p", "{"):
            self.take("p", "{")
            obj = {}
            while not self.at("p", "}"):
                key = self.take("n")
                self.take("p", ":")
                obj[key] = self.value()
            self.take("p", "}")
            return obj
        raise GqlSyntaxError(f"unexpected {tok}")


def parse_operation(text: str) -> Operation:
    return _Parser(text).operation()

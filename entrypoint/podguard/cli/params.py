"""How an option table becomes Typer parameters, and the parsed values one record handed to the command.

    @options(PREFLIGHT, ("gpu_list", "probe"), into="opts", command="health")   # tables: cli/options.py
    def health(opts: PreflightOptions, as_json: Json = False) -> None: ...

Defaults come from the record's dataclass (`PreflightOptions`, `JobOptions`), so they live in one place.
Values are parsed by podguard, so a bad one is one line naming it and what is valid (exit 64).
"""

from __future__ import annotations

import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any, TypeVar

import typer

from podguard.errors import UsageError
from podguard.preflight.selection import parse_count

__all__ = [
    "Command",
    "Group",
    "Json",
    "Param",
    "choice",
    "count",
    "options",
    "parse_int",
    "parse_ratio",
    "parse_seconds",
    "ratio",
    "seconds",
    "whole",
    "words",
]

F = TypeVar("F", bound=Callable[..., Any])

PREFLIGHT_PANEL = "Preflight"
LAUNCH_PANEL = "Launch"

Command = Annotated[list[str] | None, typer.Argument(help="The command to run, after `--`.", show_default=False)]
Json = Annotated[bool, typer.Option("--json", envvar="PODGUARD_JSON", help="Print machine-readable JSON.")]


# --------------------------------------------------------------------------------------------------
# value parsers: each error names the option (or variable) and the bad value, and says what is valid
# --------------------------------------------------------------------------------------------------


def parse_seconds(raw: Any, name: str) -> float:
    """A finite duration in seconds >= 0."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds; expected e.g. 30 or 0.5") from None
    if not (0 <= value < float("inf")):
        raise UsageError(f"{name}={raw} is not valid; expected a finite number of seconds >= 0")
    return value


def parse_int(raw: Any, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number within [minimum, maximum]."""
    bound = f">= {minimum}" if maximum is None else f"{minimum}-{maximum}"
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number; expected an integer {bound}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise UsageError(f"{name}={value} is not valid; expected an integer {bound}")
    return value


def parse_ratio(raw: Any, name: str) -> float:
    """A fraction in [0, 1] (0 turns a relative check off)."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number; expected a fraction from 0 to 1, e.g. 0.8") from None
    if not 0 <= value <= 1:
        raise UsageError(f"{name}={raw} is not valid; expected a fraction from 0 (off) to 1, e.g. 0.8")
    return value


def ratio(name: str) -> Callable[[Any], float]:
    return lambda raw: parse_ratio(raw, name)


def seconds(name: str) -> Callable[[Any], float]:
    return lambda raw: parse_seconds(raw, name)


def whole(name: str, minimum: int = 0, maximum: int | None = None) -> Callable[[Any], int]:
    return lambda raw: parse_int(raw, name, minimum, maximum)


def count(name: str, minimum: int) -> Callable[[Any], int | None]:
    return lambda raw: parse_count(raw, name, minimum=minimum)


def choice(enum: type[Any], name: str) -> Callable[[Any], Any]:
    def parse(raw: Any) -> Any:
        text = str(raw).strip().lower()
        try:
            return enum(text)
        except ValueError:
            valid = ", ".join(m.value for m in enum)
            raise UsageError(f"{name}={text!r} is not valid; choose one of: {valid}") from None

    return parse


def words(values: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated options and comma/space separated environment values alike."""
    return tuple(v for value in values or () for v in value.replace(",", " ").split() if v)


# --------------------------------------------------------------------------------------------------
# the tables
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A table of options and the record (a frozen dataclass whose defaults are the options' defaults) they fill."""

    record: type[Any]
    params: Mapping[str, Param]
    from_env: Mapping[str, str] = field(default_factory=dict)  # record fields read as is: name -> variable


@dataclass(frozen=True)
class Param:
    """One option: its flags, environment variables, the type Typer sees, and how the value is parsed."""

    decls: tuple[str, ...]
    help: str
    envvar: tuple[str, ...] = ()
    type: Any = str | None  # what Typer parses the raw text into (str: podguard parses it itself)
    parse: Callable[[Any], Any] | None = None  # raw -> record value; None: as Typer gave it
    panel: str | None = PREFLIGHT_PANEL
    metavar: str | None = None

    def option(self, name: str) -> Any:
        envvar = list(self.envvar) or f"PODGUARD_{name.upper()}"
        info = typer.Option(
            *self.decls, envvar=envvar, help=self.help, rich_help_panel=self.panel, metavar=self.metavar
        )
        return Annotated[self.type, info]


# the decorator
# --------------------------------------------------------------------------------------------------


def _defaults(record: type[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(record):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def _typer_default(value: Any) -> Any:
    """A record default as Typer shows it: enums as their text, tuples as lists, None as is."""
    if isinstance(value, tuple):
        return list(value) or None
    if isinstance(value, str):  # StrEnum members included
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def options(group: Group, names: Sequence[str], *, into: str, **fixed: Any) -> Callable[[F], F]:
    """Add the options `names` of `group` to a Typer command and hand them over as one record in `into`.

    `fixed` sets record fields the command does not expose (e.g. `command="cleanup"`, `probe="off"`).
    The command's own parameters keep their place; the table's options follow them in `--help`.
    """
    record, table = group.record, group.params
    defaults = _defaults(record)
    unknown = [n for n in (*names, *fixed) if n not in defaults]
    if unknown:
        raise TypeError(f"{record.__name__} has no field(s) {unknown}")

    def decorate(func: F) -> F:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values() if p.name != into]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=_typer_default(defaults[name]),
                annotation=table[name].option(name),
            )
            for name in names
        ]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            kwargs[into] = build_record(group, values, fixed)
            return func(**kwargs)

        params = sorted([*own, *added], key=lambda p: p.kind)
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # type: ignore[attr-defined]  # Typer must see the new signature
        return command  # type: ignore[return-value]

    return decorate


def build_record(group: Group, values: Mapping[str, Any], fixed: Mapping[str, Any]) -> Any:
    """The record from parsed option values (each through its parser) and the command's fixed fields."""
    record = group.record
    kwargs: dict[str, Any] = {}
    for name, raw in values.items():
        parse = group.params[name].parse
        kwargs[name] = parse(raw) if parse is not None else raw
    for name, variable in group.from_env.items():
        kwargs.setdefault(name, os.environ.get(variable))
    kwargs.update(fixed)
    return record(**kwargs)

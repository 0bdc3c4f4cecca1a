"""Split the selected GPUs between the roles of a job file, and check the roles' start order.

    gpus = allocate(err, tables, selection)     # {"server": (GPU0,), "trainer": (GPU1, GPU2)}

Explicit index lists are taken first, then counts in file order from what is left (in the selection's
order), then `"rest"` (at most one role) gets the remainder. Asking for more than is selected is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from podguard.errors import UsageError

if TYPE_CHECKING:
    from podguard.gpu.selected import SelectedGpu, Selection

__all__ = ["allocate", "order_check"]

Errors = Callable[[str, str], UsageError]  # (key, problem) -> a one-line UsageError naming file and key
Tables = Mapping[str, Mapping[str, Any]]
_VALID = 'a whole number >= 0, "rest", or a list of selected GPU indices such as [0, 1]'


def _selected_text(selection: Selection) -> str:
    return ", ".join(str(i) for i in dict.fromkeys(selection.indices)) or "none (CPU only)"


def _take_listed(
    err: Errors, key: str, value: list[Any], free: list[SelectedGpu], selection: Selection
) -> tuple[SelectedGpu, ...]:
    """An explicit `gpus = [0, 2]`: every MIG slice of each listed GPU, removed from `free`."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise err(key, f"= {value!r} is not valid; expected {_VALID}")
    chosen: list[SelectedGpu] = []
    for index in value:
        matches = [g for g in free if g.index == index]
        if not matches:
            taken = index in selection.indices
            why = "is given to another role" if taken else f"is not selected (selected: {_selected_text(selection)})"
            raise err(key, f"= {value!r}: GPU {index} {why}")
        for g in matches:
            free.remove(g)
        chosen.extend(matches)
    return tuple(chosen)


def allocate(err: Errors, tables: Tables, selection: Selection) -> dict[str, tuple[SelectedGpu, ...]]:
    """Each role's GPUs (see the module docstring); UsageError naming the key on any mistake."""
    free = list(selection.gpus)
    out: dict[str, tuple[SelectedGpu, ...]] = {}
    asks: list[tuple[str, int]] = []
    rest: str | None = None
    for name, table in tables.items():
        value = table.get("gpus", 0)
        if isinstance(value, list):
            out[name] = _take_listed(err, f"roles.{name}.gpus", value, free, selection)
            asks.append((name, len(out[name])))
    for name, table in tables.items():
        value = table.get("gpus", 0)
        key = f"roles.{name}.gpus"
        if isinstance(value, list):
            continue
        if value == "rest":
            if rest is not None:
                raise err(key, f'= "rest" is also used by role {rest!r}; only one role may take the rest')
            rest = name
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise err(key, f"= {value!r} is not valid; expected {_VALID}")
        asks.append((name, value))
        if value > len(free):
            total = sum(n for _, n in asks)
            wanted = ", ".join(f"{role} {n}" for role, n in asks)
            selected = _selected_text(selection)
            raise err("roles", f"ask for {total} GPU(s) ({wanted}) but {len(selection.gpus)} are selected ({selected})")
        out[name] = tuple(free[:value])
        del free[:value]
    if rest is not None:
        if not free and not selection.cpu_only:
            raise err(
                f"roles.{rest}.gpus",
                f'= "rest" gets no GPU: the other roles take all selected ({_selected_text(selection)})',
            )
        out[rest] = tuple(free)
    return out


def order_check(err: Errors, tables: Tables) -> dict[str, tuple[str, ...]]:
    """Each role's `after` list, validated: known role names and no cycle."""
    after: dict[str, tuple[str, ...]] = {}
    for name, table in tables.items():
        value = table.get("after", [])
        key = f"roles.{name}.after"
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise err(key, f"= {value!r} is not valid; expected a list of role names")
        for dep in value:
            if dep not in tables:
                raise err(key, f"= {value!r} names unknown role {dep!r}; roles are: {', '.join(tables)}")
        after[name] = tuple(dict.fromkeys(value))
    _check_cycles(err, after)
    return after


def _check_cycles(err: Errors, after: Mapping[str, tuple[str, ...]]) -> None:
    """Depth-first search with colours (1 = on the current path, 2 = done)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in after[node]:
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise err("roles", f"'after' forms a cycle: {' -> '.join(cycle)}; no role in it could ever start")
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for name in after:
        if name not in state:
            visit(name)

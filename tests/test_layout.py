"""The house rules that keep the package navigable: names that never shadow the SDKs, one options table."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from podguard.cli.options import LAUNCH, PREFLIGHT

ROOT = Path(__file__).resolve().parents[1]


def test_repo_root_folders_never_shadow_the_sdks() -> None:
    """`docker/` and `runpod/` at the repo root are data folders: from the repo root, the SDKs load."""
    code = (
        "import runpod, docker, sys; "
        "bad = [m.__name__ for m in (runpod, docker) if 'site-packages' not in (getattr(m, '__file__', None) or '')]; "
        "print(*bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr or proc.stdout


def test_nothing_is_named_runpod_or_docker_where_python_could_import_it() -> None:
    for folder in ("runpod", "docker"):
        assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/ must stay a data folder"
    offenders = [
        str(p.relative_to(ROOT))
        for base in (ROOT / "entrypoint", ROOT / "tests", ROOT / "bench")
        for p in base.rglob("*")
        if p.stem in ("runpod", "docker") and "__pycache__" not in p.parts
    ]
    assert offenders == []


@pytest.mark.parametrize("group", [PREFLIGHT, LAUNCH], ids=["preflight", "launch"])
def test_every_option_has_a_default_in_its_record_and_a_podguard_variable(group) -> None:
    fields = set(group.record.__dataclass_fields__)
    for name, param in group.params.items():
        assert name in fields, f"{name} has no field in {group.record.__name__}"
        envvars = param.envvar or (f"PODGUARD_{name.upper()}",)
        assert any(v.startswith("PODGUARD_") for v in envvars), name


def _tracked_files() -> list[Path]:
    """Every file git tracks (a clone's view), plus new files not yet committed that git does not ignore."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if proc.returncode == 0:
        return [ROOT / name for name in proc.stdout.decode().split("\0") if name and (ROOT / name).is_file()]
    skip = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache"}  # not a checkout
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def test_nothing_in_the_repo_cites_a_contract_outside_it() -> None:
    """The contract the code relies on lives in docs/ (reference.md, formats.md): a newcomer with a clone must be
    able to open every page the code cites. CHANGELOG.md records history and is not read as the contract."""
    outside = "PRODUCT" + ".md"
    offenders = []
    for path in _tracked_files():
        if path.name == "CHANGELOG.md":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if outside in line]
    assert offenders == [], f"cite docs/ instead of {outside}: {offenders}"


# --- the map (docs/architecture.md) against the package ---------------------------------------------------------

PACKAGE = ROOT / "entrypoint" / "podguard"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FLOOR = "top level"  # the rooms' order's last line: the top-level modules


def _section(title: str) -> list[str]:
    """The lines of docs/architecture.md's `## <title>` section."""
    lines = ARCHITECTURE.read_text().splitlines()
    assert f"## {title}" in lines, f"docs/architecture.md has no '## {title}' section"
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _rows() -> dict[str, str]:
    """First cell's folder -> the row's second cell, for each row of the rooms' table."""
    rows = {}
    for line in _section("The rooms"):
        if not line.startswith("| `"):
            continue
        first, second = line.split(" | ", 2)[:2]
        (folder,) = re.findall(r"`([^`]+)`", first)
        rows[folder.removeprefix("entrypoint/podguard/")] = second
    return rows


def _package_folders() -> set[str]:
    return {
        str(p.parent.relative_to(PACKAGE)) + "/"
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and "__pycache__" not in p.parts
    }


def _top_level_modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}


def test_every_package_folder_has_a_row_in_the_architecture_and_every_row_exists() -> None:
    rows = {folder for folder in _rows() if folder != "*.py"}
    assert sorted(_package_folders() - rows) == [], "add a row to docs/architecture.md, 'The rooms'"
    assert sorted(rows - _package_folders()) == [], "a row of docs/architecture.md names no package folder"


def test_the_architecture_lists_exactly_the_top_level_modules() -> None:
    listed = set(re.findall(r"`([a-z_]+)`", _rows()["*.py"]))
    assert sorted(_top_level_modules() - listed) == [], "name the module in docs/architecture.md's top-level row"
    assert sorted(listed - _top_level_modules()) == [], "docs/architecture.md's top-level row names a module not there"


# --- the rooms' order is never climbed ----------------------------------------------------------------------------

# Climbs that exist today, each with the fix in flight (issue 32): the lead removes an entry when its fix merges,
# and a listed climb that no longer exists fails the test below so that the list never outlives the climb.
KNOWN_CLIMBS: set[tuple[str, str]] = set()  # none: guards/save.py declares the UploadWait Protocol it needs


def _order() -> dict[str, int]:
    """Room -> its line in docs/architecture.md's drawing (0 the top)."""
    lines = _section("The rooms' order")
    start = lines.index("```text") + 1
    block = lines[start : lines.index("```", start)]
    return {room.strip(): depth for depth, line in enumerate(block) for room in line.split("|") if room.strip()}


def _room(module: str) -> str:
    """`podguard.launch.watch.runtime` -> "launch"; a top-level module (or the package itself) -> FLOOR."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else FLOOR


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every podguard module `path` imports, at module level and inside functions, as absolute names."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module's package; an __init__'s is its own folder
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return [(line, name) for line, name in found if name == "podguard" or name.startswith("podguard.")]


def _climbs() -> tuple[list[str], set[tuple[str, str]]]:
    order = _order()
    unknown, climbs = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "__main__.py":  # `python -m podguard`: the one way in, above every room
            continue
        here = _room("podguard." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        if here not in order:
            unknown.append(here)
            continue
        for _, name in _imports(path):
            there = _room(name)
            if there == here:
                continue
            if there not in order:
                unknown.append(there)
            elif order[there] <= order[here]:
                climbs.add((rel, name))
    return sorted(set(unknown)), climbs


def test_every_room_is_in_the_drawn_order() -> None:
    unknown, _ = _climbs()
    assert unknown == [], "draw these rooms in docs/architecture.md, 'The rooms' order'"
    assert set(_order()) == {f.split("/")[0] for f in _package_folders()} | {FLOOR}


def test_no_import_climbs_the_rooms_order() -> None:
    """A room imports only rooms drawn below it, at module level and inside functions alike; rooms drawn on one
    line never import each other."""
    _, climbs = _climbs()
    order = _order()
    new = [
        f"{rel} imports {name}: {_room(name)!r} is not drawn below {rel.split('/')[0]!r}"
        for rel, name in sorted(climbs - KNOWN_CLIMBS)
    ]
    assert new == [], f"the rooms' order is {order}"
    assert sorted(KNOWN_CLIMBS - climbs) == [], "these climbs are gone: remove them from KNOWN_CLIMBS"


def test_preflight_and_launch_never_import_each_other() -> None:
    """They meet in job/: the preflight decides which GPUs, the launch runs the processes on them."""
    for here, there in (("preflight", "launch"), ("launch", "preflight")):
        offenders = [
            f"{path.relative_to(PACKAGE)}:{line} imports {name}"
            for path in sorted((PACKAGE / here).rglob("*.py"))
            for line, name in _imports(path)
            if _room(name) == there
        ]
        assert offenders == []


def test_the_top_level_modules_import_no_room() -> None:
    offenders = [
        f"{path.name}:{line} imports {name}"
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name != "__main__.py"
        for line, name in _imports(path)
        if _room(name) != FLOOR
    ]
    assert offenders == []


def test_the_top_level_keeps_only_what_every_room_shares() -> None:
    """At most 10 modules beside `__init__` and `__main__`: a module that one room owns lives in that room."""
    assert len(_top_level_modules()) <= 10, sorted(_top_level_modules())


def test_no_module_is_over_450_lines() -> None:
    """Small modules with one job each: a module past 450 lines is two jobs (split it by what it does)."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 450 and "__pycache__" not in p.parts
    }
    assert long == {}


# What podguard says goes through podguard.console (docs/architecture.md, "One console"): no function takes a
# line sink, a stream for podguard's lines or a printing Progress. Allowed: console.py's own `stream` (a command's
# stdout), and the workers' terminal of launch/ (`terminal`, and `err` where loud lines go when it stalls).
_SINK_NAMES = {"say", "out", "warn", "note", "on_wait", "progress", "emit"}
# rank/wrap.py is its own program inside torchrun (standard library only): its lines are its rank's output, written
# with the rank's prefix in one os.write (docs/torchrun.md), not podguard's console lines.
_OWN_PROGRAMS = {"rank/wrap.py"}


def _is_line_sink(name: str, note: str) -> bool:
    if re.search(r"\bTextIO\b", note):
        return name not in ("terminal", "err")
    sink_type = re.fullmatch(r"(Say|Warn|Progress)( \| None)?", note) or "Callable[[str]" in note
    return bool(sink_type) and name in _SINK_NAMES


def _line_sinks() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts or path.relative_to(PACKAGE).as_posix() in {"console.py", *_OWN_PROGRAMS}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if _is_line_sink(arg.arg, note):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}({arg.arg}: {note})")
    return found


def test_nothing_takes_a_line_sink_podguard_speaks_through_its_console() -> None:
    assert _line_sinks() == []


def test_the_loggers_only_keep_debug_records_what_a_user_must_see_is_a_console_line() -> None:
    """A `log.warning` with no handler reaches stderr bare (logging's last resort), without the prefix, the
    redaction or the quiet rule: a warning is `console.warn`; loggers keep records for PODGUARD_DEBUG=1."""
    loud = re.compile(r"\blog(ger)?\.(warning|error|exception|critical)\(")
    found = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
        for n, text in enumerate(p.read_text().splitlines(), 1)
        if loud.search(text)
    ]
    assert found == []

#!/usr/bin/env python3
"""Is this checkout ready to be released as the version it names? Used by `make release-check` and by
.github/workflows/release.yml before anything is published.

    python .github/scripts/release_check.py [--tag vX.Y.Z] [--notes FILE] [--dry-run] [DIST]

Checks, each printed as one line (exit 1 when any fails; argparse exits 2 on bad arguments):
- the version: `__version__` in entrypoint/podguard/__init__.py (read as text: the one place it lives);
- `--tag` (or GITHUB_REF_NAME on a tag push) is `v<version>`;
- CHANGELOG.md has a `## [<version>] - YYYY-MM-DD` section (`--notes FILE` writes its text, for the GitHub
  release), and its `## [Unreleased]` section lists nothing (its entries were moved under the version);
- DIST (default dist/) holds exactly this version's wheel and sdist, and the wheel's own metadata says the same
  version (`twine check --strict` is run beside this, by the Makefile and the workflow).
`--dry-run` (the workflow run by hand, with no tag): the changelog's readiness is reported, not failed — between
releases main has entries under Unreleased and no section for the next version, by design; the version and the
built files are still checked. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION_FILE = ROOT / "entrypoint" / "podguard" / "__init__.py"
CHANGELOG = ROOT / "CHANGELOG.md"


def package_version() -> str:
    """`__version__` from the package's __init__.py, without importing it."""
    match = re.search(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(), re.MULTILINE)
    if not match:
        raise SystemExit(f'release check: no `__version__ = "..."` line in {VERSION_FILE}')
    return match.group(1)


def changelog_section(version: str, text: str) -> str | None:
    """The body of `## [version] - YYYY-MM-DD`, or None when there is no such dated section."""
    heading = re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}[ \t]*$", text, re.MULTILINE)
    if heading is None:
        return None
    rest = text[heading.end() :]
    end = re.search(r"^## |^\[[^\]]+\]: ", rest, re.MULTILINE)
    return (rest[: end.start()] if end else rest).strip()


def unreleased_entries(text: str) -> list[str]:
    """The list items still under `## [Unreleased]` (HTML comments, the placeholders, do not count)."""
    heading = re.search(r"^## \[Unreleased\][ \t]*$", text, re.MULTILINE)
    if heading is None:
        return []
    rest = re.sub(r"<!--.*?-->", "", text[heading.end() :], flags=re.DOTALL)
    end = re.search(r"^## ", rest, re.MULTILINE)
    return re.findall(r"^\s*[-*] .+$", rest[: end.start()] if end else rest, re.MULTILINE)


def check_dist(dist: Path, version: str) -> list[str]:
    """Problems with dist/: exactly this version's wheel and sdist, the wheel's metadata agreeing."""
    wheel = dist / f"podguard-{version}-py3-none-any.whl"
    sdist = dist / f"podguard-{version}.tar.gz"
    problems = []
    found = sorted(p.name for p in dist.iterdir()) if dist.is_dir() else []
    expected = sorted([wheel.name, sdist.name])
    if found != expected:
        problems.append(f"{dist} holds {found or 'nothing'}; expected exactly {expected} (run `make dist`)")
    if wheel.is_file():
        with zipfile.ZipFile(wheel) as zf:
            metadata = zf.read(f"podguard-{version}.dist-info/METADATA").decode()
        meta_version = re.search(r"^Version: (.+)$", metadata, re.MULTILINE)
        if not meta_version or meta_version.group(1).strip() != version:
            problems.append(f"{wheel.name}'s metadata says version {meta_version and meta_version.group(1)!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", nargs="?", type=Path, default=ROOT / "dist", help="the built wheel and sdist")
    parser.add_argument("--tag", help="the git tag being released (default: GITHUB_REF_NAME on a tag push)")
    parser.add_argument("--notes", type=Path, help="write the CHANGELOG section of this version here")
    parser.add_argument("--dry-run", action="store_true", help="report the changelog's readiness, do not fail on it")
    args = parser.parse_args(argv)
    tag = args.tag or (os.environ.get("GITHUB_REF_NAME") if os.environ.get("GITHUB_REF_TYPE") == "tag" else None)

    version = package_version()
    problems: list[str] = []
    print(f"release check: version {version} (from {VERSION_FILE.relative_to(ROOT)})")
    if tag is not None:
        if tag == f"v{version}":
            print(f"release check: tag {tag} names it")
        else:
            problems.append(f"the tag {tag!r} does not name the package version: expected 'v{version}'")
    changelog = CHANGELOG.read_text()
    release_problems: list[str] = []  # what only a release needs: a dry run reports them
    section = changelog_section(version, changelog)
    if section is None:
        release_problems.append(f"CHANGELOG.md has no `## [{version}] - YYYY-MM-DD` section (move Unreleased under it)")
    elif not section:
        release_problems.append(f"CHANGELOG.md's section for {version} is empty")
    else:
        print(f"release check: CHANGELOG.md has the section for {version}")
        if args.notes is not None:
            args.notes.write_text(section + "\n")
    if left := unreleased_entries(changelog):
        release_problems.append(
            f"CHANGELOG.md: {len(left)} change(s) still under Unreleased; move them under [{version}]"
        )
    if args.dry_run and tag is None:
        for problem in release_problems:
            print(f"release check: dry run: a release would need: {problem}")
    else:
        problems += release_problems
    dist_problems = check_dist(args.dist, version)
    if not dist_problems:
        print(f"release check: {args.dist} holds this version's wheel and sdist")
    problems += dist_problems
    for problem in problems:
        print(f"release check: NOT READY: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""What an image is built from: the source checkout, its version and git revision, the Dockerfile's default base.

    root = find_checkout(Path.cwd())        # the folder with the Dockerfile and docker/
    meta = source_metadata(root)            # version, revision ("abc1234" / "abc1234-dirty"), source URL
    default_base(root)                      # the Dockerfile's `ARG BASE_IMAGE=...`, its one definition

The source URL goes into an OCI label, so any credentials in a git remote (`https://user:token@host/...`)
are removed first.
"""

from __future__ import annotations

import re
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from podguard import __version__
from podguard.errors import UsageError

__all__ = ["SourceMetadata", "default_base", "find_checkout", "public_url", "source_metadata"]

_BASE_ARG = re.compile(r"^ARG\s+BASE_IMAGE=(\S+)\s*$", re.MULTILINE)
# scp-like git remotes: user@host:path
_SCP_LIKE = re.compile(r"^(?:[^@/\s]+@)?(?P<host>[^:/\s]+):(?P<path>[^/].*)$")


@dataclass(frozen=True)
class SourceMetadata:
    version: str
    revision: str  # short commit, "-dirty" when the tree has changes; "unknown" outside git
    source: str  # a credential-free URL of the repository; "" when unknown


def find_checkout(start: Path) -> Path:
    """The nearest folder at or above `start` that holds a Dockerfile and docker/build-wheelhouse.sh."""
    for folder in (start.resolve(), *start.resolve().parents):
        if (folder / "Dockerfile").is_file() and (folder / "docker" / "build-wheelhouse.sh").is_file():
            return folder
    raise UsageError(
        f"no podguard source checkout at or above {start} (a folder with Dockerfile and docker/); "
        "run `podguard image build` inside one or pass --context DIR"
    )


def default_base(root: Path) -> str:
    match = _BASE_ARG.search((root / "Dockerfile").read_text())
    if not match:
        raise UsageError(f"{root / 'Dockerfile'} has no `ARG BASE_IMAGE=...` line; pass --base IMAGE")
    return match.group(1)


def public_url(remote: str) -> str:
    """A git remote as a URL without user name, password or token (scp-like remotes become https)."""
    remote = remote.strip()
    if "://" in remote:
        parts = urllib.parse.urlsplit(remote)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
    match = _SCP_LIKE.match(remote)
    if match:
        return f"https://{match.group('host')}/{match.group('path')}"
    return ""


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def source_metadata(root: Path, source: str | None = None) -> SourceMetadata:
    """Version, git revision and source URL; `source` overrides the git remote (credentials still removed)."""
    revision = _git(root, "rev-parse", "--short=12", "HEAD") or "unknown"
    if revision != "unknown" and _git(root, "status", "--porcelain", "--untracked-files=no"):
        revision += "-dirty"
    remote = source if source is not None else _git(root, "config", "--get", "remote.origin.url") or ""
    return SourceMetadata(version=__version__, revision=revision, source=public_url(remote) if remote else "")

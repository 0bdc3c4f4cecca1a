"""The keepers on this machine, whatever their HOME, user or state dir: one entry per keeper, locked while it lives.

    me = register("llm-train", poll_s=30)      # Registration, or Refused(entry) when a live keeper of the name runs
    me.lease(time.time() + 90)                 # before a create: by when it has landed (`pod down` waits for it)
    me.close()                                 # the entry goes (or stays, unlocked, while a lease is pending)
    entries("llm-train")                       # every keeper of the name here: pid, alive, lease, HOME
    end_local_keepers("llm-train", wait_s=10)  # SIGTERM to each live one, proven first; their leases

The registry is machine-wide, not under HOME: `/tmp/podguard-keepers/<uid>/<name>.<pid>.json` (PODGUARD_KEEPERS_DIR
moves it; tests do), so `pod down` finds a keeper started under sudo, by systemd or in another state dir. A keeper
holds an exclusive `flock` on its own entry while it lives; a lock that is held proves that the process that made
the entry, the pid in its name, is alive and is that keeper (the file is opened close-on-exec, and a keeper does not
fork), so a pid is signalled only while its lock is held (and, where /proc exists, while its command line is a
`pod keep`): never an unrelated process that reused a dead keeper's pid. An entry outlives a keeper killed with a
create in flight: its lease tells `pod down` how long that create may still land.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from podguard import console

__all__ = [
    "ENV_KEEPERS_DIR",
    "Entry",
    "LocalEnd",
    "Refused",
    "Registration",
    "Unregistered",
    "end_local_keepers",
    "entries",
    "register",
    "safe_name",
]

ENV_KEEPERS_DIR = "PODGUARD_KEEPERS_DIR"
DEFAULT_BASE = "/tmp/podguard-keepers"  # machine-wide on purpose (not $TMPDIR, which is per user on macOS)


def safe_name(name: str) -> str:
    """A file name for a pod name (RunPod names may hold spaces and slashes): readable, and unique by a hash."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:120] or "pod"
    if cleaned != name:
        cleaned += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return cleaned


def _base() -> Path:
    return Path(os.environ.get(ENV_KEEPERS_DIR, "").strip() or DEFAULT_BASE)


def _own_dir() -> Path:
    base = _base()
    if not base.is_dir():
        base.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            base.chmod(0o1777)  # every user's keepers register here, each in a folder of its own
    own = base / str(os.getuid())
    own.mkdir(mode=0o755, exist_ok=True)
    return own


@dataclass(frozen=True)
class Entry:
    path: Path
    name: str
    pid: int
    uid: int
    alive: bool  # its lock is held: the keeper runs
    lease_until: float  # a create it sent may land until then (time.time())
    home: str = ""
    state_dir: str = ""
    poll_s: float = 30.0
    host: str = ""

    def where(self) -> str:
        return f"pid {self.pid}" + (f" (HOME {self.home})" if self.home else "")


@dataclass(frozen=True)
class Refused:
    """A live keeper of the name runs on this machine already."""

    entry: Entry


class Registration:
    """This keeper's entry, locked while it lives."""

    def __init__(self, path: Path, fd: int, data: dict[str, object]) -> None:
        self.path, self._fd, self._data = path, fd, data
        self._pending: dict[int, float] = {}  # lease token -> until
        self._tokens = 0

    def lease(self, until: float) -> int:
        """A create (start) is about to be sent: it may land until `until`. A token for `release` (best effort: a
        failed write is no reason to stop; the keeper's own sweep still finds what lands)."""
        self._tokens += 1
        self._pending[self._tokens] = until
        self._publish()
        return self._tokens

    def pending(self) -> float:
        """Until when a create (start) this keeper sent, whose answer was lost, may still land (0: none)."""
        now = time.time()
        return max((v for v in self._pending.values() if v > now), default=0.0)

    def release(self, token: int) -> None:
        """Its answer came (made, or refused for good): nothing of it can land later."""
        if self._pending.pop(token, None) is not None:
            self._publish()

    def _publish(self) -> None:
        now = time.time()
        self._pending = {k: v for k, v in self._pending.items() if v > now}
        until = max(self._pending.values(), default=0.0)
        if until != float(self._data.get("lease_until") or 0.0):  # type: ignore[arg-type]
            self._data["lease_until"] = round(until, 3)
            self._write()

    def _write(self) -> None:
        raw = json.dumps(self._data).encode()
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, raw, 0)

    def close(self) -> None:
        if self._fd < 0:
            return
        if float(self._data.get("lease_until") or 0.0) <= time.time():  # type: ignore[arg-type]
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)  # the lock goes with it
        self._fd = -1


class Unregistered(Registration):
    """The registry cannot be used here (a read-only or foreign /tmp): no entry, no lease; `pod down` on this
    machine reaches this keeper through the keep's record alone."""

    def __init__(self, why: str) -> None:
        super().__init__(Path(), -1, {})
        self.why = why

    def lease(self, until: float) -> int:
        self._tokens += 1
        self._pending[self._tokens] = until  # kept in memory: the keeper's own end still waits for it
        return self._tokens

    def release(self, token: int) -> None:
        self._pending.pop(token, None)

    def close(self) -> None:
        return None


def register(name: str, *, poll_s: float, state_dir: str = "") -> Registration | Refused:
    """Enter this process as the keeper of `name`, or Refused when a live one runs on this machine already; an
    Unregistered one when the registry cannot be written (said by the caller, never the end of a keeper)."""
    try:
        return _register(name, poll_s=poll_s, state_dir=state_dir)
    except OSError as exc:
        return Unregistered(f"{_base()}: {exc.strerror or exc}")


def _register(name: str, *, poll_s: float, state_dir: str) -> Registration | Refused:
    own = _own_dir()
    with _admission(_base()):
        for entry in entries(name):
            if entry.alive and entry.pid != os.getpid():
                return Refused(entry)
        path = own / f"{safe_name(name)}.{os.getpid()}.json"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        data: dict[str, object] = {
            "name": name,
            "pid": os.getpid(),
            "home": os.environ.get("HOME", ""),
            "state_dir": state_dir,
            "poll_s": poll_s,
            "host": socket.gethostname(),
            "started": round(time.time(), 3),
            "lease_until": 0.0,
        }
        registration = Registration(path, fd, data)
        registration._write()
        return registration


@contextlib.contextmanager
def _admission(base: Path):  # type: ignore[no-untyped-def]
    """One registration at a time on this machine (two keepers started in the same moment: one is refused)."""
    fd = -1
    with contextlib.suppress(OSError):
        fd = os.open(base / "admission.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # every user takes it (its owner's umask may have narrowed it)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def entries(name: str) -> list[Entry]:
    """Every keeper of `name` on this machine (any user), live ones and dead ones with a lease still pending; dead
    entries whose lease passed are removed where this user may."""
    prefix = safe_name(name) + "."
    found: list[Entry] = []
    with contextlib.suppress(OSError):
        for folder in _base().iterdir():
            if not folder.is_dir() or not folder.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                for path in folder.glob(f"{prefix}*.json"):
                    pid = path.name[len(prefix) : -len(".json")]
                    entry = _read(path, name, int(pid), int(folder.name)) if pid.isdigit() else None
                    if entry is None:
                        continue
                    if not entry.alive and entry.lease_until <= time.time():
                        with contextlib.suppress(OSError):
                            path.unlink()
                        continue
                    found.append(entry)
    return found


def _read(path: Path, name: str, pid: int, uid: int) -> Entry | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        alive = _locked(fd)
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict) or data.get("name", name) != name:
        return None
    return Entry(
        path=path,
        name=name,
        pid=pid,
        uid=uid,
        alive=alive,
        lease_until=float(data.get("lease_until") or 0.0),
        home=str(data.get("home") or ""),
        state_dir=str(data.get("state_dir") or ""),
        poll_s=float(data.get("poll_s") or 30.0),
        host=str(data.get("host") or ""),
    )


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def proven(entry: Entry) -> bool:
    """`entry.pid` is, right now, a keeper of its name: its lock is held (and, where /proc exists, its command line
    is a `pod keep`). Only then is it signalled."""
    again = _read(entry.path, entry.name, entry.pid, entry.uid)
    if again is None or not again.alive:
        return False
    cmdline = Path(f"/proc/{entry.pid}/cmdline")
    if Path("/proc/self/cmdline").exists():
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            return False
        return b"keep" in words
    return True


@dataclass(frozen=True)
class LocalEnd:
    ended: list[Entry]  # the keepers signalled
    left: list[Entry]  # live keepers of the name still running (another user's, or one that did not end in time)
    lease_until: float  # a create one of them sent may land until then (0: none in flight)


def end_local_keepers(name: str, *, wait_s: float) -> LocalEnd:
    """SIGTERM to every live keeper of `name` on this machine that is proven to be one, then wait (up to `wait_s`:
    a keeper holds the signal while a create is in flight) for them to end; what their leases say."""
    seen = entries(name)
    signalled: list[Entry] = []
    for entry in seen:
        if not entry.alive:
            continue
        if not proven(entry):
            console.say(f"the entry of pid {entry.pid} is not a live keeper of {name}: not signalled")
            continue
        try:
            os.kill(entry.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        except PermissionError:
            console.say(
                f"the keeper of {name} {entry.where()} runs as another user: it cannot be ended from here; it reads "
                "the record before its next action and ends itself"
            )
            signalled.append(entry)
            continue
        console.say(f"ending the keeper of {name} on this machine ({entry.where()}) first")
        signalled.append(entry)
    ended = list(signalled)
    deadline = time.monotonic() + wait_s
    while signalled and time.monotonic() < deadline:
        live = {e.pid for e in entries(name) if e.alive}
        signalled = [e for e in signalled if e.pid in live]
        if signalled:
            time.sleep(0.05)
    after = entries(name)
    lease = max([e.lease_until for e in [*seen, *after]], default=0.0)
    return LocalEnd(ended, [e for e in after if e.alive], lease if lease > time.time() else 0.0)

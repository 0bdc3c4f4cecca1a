"""The textfile of `--metrics-file`, for node_exporter's textfile collector.

    writer = FileWriter(path, registry, every_s=15)   # writes once now (64 when it cannot), then on its thread
    ...                                               # (a failed write: one warning on the console)
    writer.close()                                    # a last write; the file keeps its last values

The file is replaced whole each time: the text goes to a hidden temporary file in the same folder, then a rename
over the old one (atomic on one filesystem), so the collector never reads half a file. A rename replaces whatever
has the name, so only a regular file (or no file yet) is ever replaced: a FIFO, a device node, a symlink, a folder
or a socket at PATH is exit 64 at the start, naming it, and left alone if one appears there during the run. A write
that fails during the run (a full volume, the folder gone, such a thing at PATH) leaves what is there, removes its
temporary file, says one warning (and one line when writing works again) and never fails the job.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.errors import UsageError
from podguard.metrics.exposition import render

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["FILE_INTERVAL_S", "FileWriter", "collector_note", "not_a_regular_file"]

FILE_INTERVAL_S = 15.0  # docs/metrics.md; PODGUARD_METRICS_INTERVAL changes it (tests, a faster collector)
CLOSE_WAIT_S = 5.0  # at the end, how long a write still in flight (a stalled network volume) is waited for
_KINDS = (  # what a path can be besides a regular file, as said in the messages
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
EXAMPLE = "/var/lib/node_exporter/textfile/podguard.prom"


def not_a_regular_file(path: Path) -> str | None:
    """What is at `path` when it is there and not a regular file ("a FIFO (named pipe)", "a symbolic link to
    'x.prom'"), else None (a regular file, or nothing yet). The link itself is looked at, never its target."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError:
        return None  # (a folder that cannot be searched: the write says why)
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            kind += f" to {os.readlink(path)!r}"
    return kind


def collector_note(path: Path) -> str | None:
    """A warning's text (console.warn) for a name the collector skips: it reads `*.prom` files only."""
    if path.name.endswith(".prom"):
        return None
    return (
        f"--metrics-file={str(path)!r} does not end in .prom: node_exporter's textfile collector reads only "
        "*.prom files and will not see it"
    )


class FileWriter:
    """The textfile: written at once (so a bad path is 64 before the job), then every `every_s` on a daemon
    thread, and a last time at `close()`."""

    def __init__(
        self,
        path: Path,
        registry: CollectorRegistry,
        *,
        every_s: float = FILE_INTERVAL_S,
        close_wait_s: float = CLOSE_WAIT_S,
    ) -> None:
        self.path = path
        self._registry = registry
        self._every_s = every_s
        self._close_wait_s = close_wait_s
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # the thread's write and close()'s last one never interleave
        self.writes = 0
        self.error: str | None = None  # why the last write failed (a full volume), until one works again
        if (kind := not_a_regular_file(path)) is not None:
            raise UsageError(
                f"--metrics-file={str(path)!r} is {kind}, not a regular file; give the path of a regular file or a "
                f"new one (it is replaced whole at each write), e.g. {EXAMPLE}"
            )
        try:
            self.write()
        except OSError as exc:
            raise UsageError(
                f"--metrics-file={str(path)!r} cannot be written: {exc.strerror or exc}; give a path in a writable "
                f"folder (node_exporter's --collector.textfile.directory, e.g. {EXAMPLE})"
            ) from None
        self._thread = threading.Thread(target=self._run, name="podguard-metrics-file", daemon=True)
        self._thread.start()

    def write(self) -> None:
        """Replace the file whole: a hidden temporary file beside it, then a rename (atomic on one filesystem)."""
        text = render(self._registry)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")  # (not *.prom: the collector skips it)
        with self._write_lock:
            try:
                with open(tmp, "wb") as fh:
                    fh.write(text)
                if (kind := not_a_regular_file(self.path)) is not None:  # (put there during the run)
                    raise OSError(errno.EEXIST, f"it is now {kind}, not a regular file, and is left alone")
                os.replace(tmp, self.path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
            self.writes += 1

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self._write_or_warn()

    def _write_or_warn(self) -> None:
        """One write during the run: a failure is said once (not every interval), a recovery once."""
        try:
            self.write()
        except OSError as exc:  # a full volume, the folder gone: try again next time; the job never fails for it
            if self.error is None:
                console.warn(
                    f"--metrics-file={str(self.path)!r} cannot be written: {exc.strerror or exc}; it keeps "
                    "its last values (tried again every interval; the job goes on)"
                )
            self.error = exc.strerror or str(exc)
            return
        if self.error is not None:
            console.say(f"--metrics-file={str(self.path)!r} is written again")
            self.error = None

    def close(self) -> None:
        """Stop the thread and write the last values (best effort, said like any other failed write). A write that
        has not returned (a stalled volume) is left to its daemon thread: the end of the run never waits on it."""
        self._stop.set()
        self._thread.join(timeout=self._close_wait_s)
        if self._thread.is_alive():
            console.warn(
                f"--metrics-file={str(self.path)!r}: a write has not returned for {self._close_wait_s:g} s "
                "(a stalled volume?); the last values are not written"
            )
            return
        self._write_or_warn()

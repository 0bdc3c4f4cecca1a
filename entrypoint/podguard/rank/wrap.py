"""The torchrun rank wrapper: run one worker, prefix its lines, record how it ended, end the same way.

    python -m podguard.rank.wrap LABEL [--prefix=rank{rank}:] [--log-dir=DIR] [--gpus=0,1] [--show=0,1]
                                 [--activity=1] -- CMD...

torchrun starts it once per rank (`build_torchrun_spec` puts it in front of the user's command). It reads
the worker's stdout and stderr, writes whole lines prefixed `rank{N}:` in single writes of at most
PIPE_BUF bytes (ranks never interleave mid-line; a rank `--show` leaves out marks its lines HIDDEN: podguard
keeps them off the terminal, while its watch and log files get every line; with `--activity=1` output without a
line end, which it holds until the line ends, is told to podguard as an ACTIVITY mark), appends them to `rank{N}.log`
(best-effort: a full volume costs the log, never the job), writes `podguard_exit.json` next to torch's error
file, and then exits with the worker's code or dies by the worker's signal. Standard library only (and the marks of
`rank/marks.py`, which imports nothing); docs/torchrun.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from podguard.errors import ExitCode, signal_exit_code
from podguard.rank.marks import ACTIVITY, HIDDEN

__all__ = ["DEFAULT_RANK_PREFIX", "EXIT_FILE", "WRAP_MODULE", "main"]

WRAP_MODULE = "podguard.rank.wrap"
EXIT_FILE = "podguard_exit.json"  # next to torch's per-worker error.json
DEFAULT_RANK_PREFIX = "rank{rank}:"
PIPE_BUF = 4096  # POSIX: writes up to this size to a pipe are atomic (Linux: 4096)
TAIL_LINES = 20
DRAIN_AFTER_EXIT_S = 0.5  # grandchildren (data loader workers) may hold the pipes open: drain briefly
ACTIVITY_EVERY_S = 1.0  # output without a line end: podguard hears of it at most this often (a dot per step)
_LINE_END = re.compile(rb"\r\n|\r|\n")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

Warn = Callable[[str], None]


@dataclass(frozen=True)
class WrapOptions:
    prefix: str = DEFAULT_RANK_PREFIX
    log_dir: str | None = None
    gpus: tuple[str, ...] = ()
    show: tuple[str, ...] | None = None  # local ranks whose lines are shown on the terminal; None = all
    activity: bool = False  # tell podguard of output without a line end (ACTIVITY marks: podguard's watch reads them)
    command: tuple[str, ...] = ()


def parse_args(argv: list[str]) -> WrapOptions:
    """`--key=value` options before `--`, the command after it; anything else is the label (ignored)."""
    sep = argv.index("--") if "--" in argv else len(argv)
    opts = dict(item.partition("=")[::2] for item in argv[:sep] if item.startswith("--") and "=" in item)
    show = opts.get("--show")
    return WrapOptions(
        prefix=opts.get("--prefix", DEFAULT_RANK_PREFIX),
        log_dir=opts.get("--log-dir") or None,
        gpus=tuple(g for g in opts.get("--gpus", "").split(",") if g),
        show=None if show is None else tuple(show.split(",")),
        activity=opts.get("--activity") == "1",
        command=tuple(argv[sep + 1 :]),
    )


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "") or default)
    except ValueError:
        return default


@dataclass(frozen=True)
class RankIdentity:
    """Who this worker is, from torchrun's environment."""

    rank: int
    local_rank: int
    group_rank: int
    nnodes: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RankIdentity:
        return cls(
            _int(env, "RANK", 0),
            _int(env, "LOCAL_RANK", 0),
            _int(env, "GROUP_RANK", 0),
            _int(env, "GROUP_WORLD_SIZE", 1),
        )

    def prefix(self, template: str, gpus: tuple[str, ...]) -> bytes:
        gpu = gpus[self.local_rank] if self.local_rank < len(gpus) else "cpu"
        fields = {"rank": self.rank, "local_rank": self.local_rank, "node_rank": self.group_rank, "gpu": gpu}
        return template.format(**fields).encode()


class RankLog:
    """`rank{N}.log`, best-effort: the first failed open or write prints one warning and stops the log."""

    def __init__(self, path: Path | None, warn: Warn) -> None:
        self.path = path
        self._warn = warn
        self._fh: BinaryIO | None = None
        if path is not None:
            try:
                self._fh = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
            except OSError as exc:
                self._fail(exc, "cannot be opened")

    def write(self, data: bytes) -> None:
        if self._fh is None:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[self._fh.write(view) or 0 :]
        except OSError as exc:  # ENOSPC, EIO, EROFS...: the terminal copy and the job go on
            self._fail(exc, "could not be written")

    def _fail(self, exc: OSError, what: str) -> None:
        self.close()
        self._warn(f"warning: log file {self.path} {what} ({exc.strerror or exc}); lines go to the terminal only")

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()


class LineStream:
    """One of the worker's pipes, cut into whole lines (`\\n`, `\\r\\n` and bare `\\r` end a line)."""

    def __init__(
        self, dst: int, prefix: bytes, show: bool, log: RankLog, tail: deque[str], activity: bool = False
    ) -> None:
        # every line goes to podguard (its watch and log files need them); a hidden one is marked for the terminal
        self.dst, self.prefix, self.log, self.tail = dst, prefix if show else HIDDEN + prefix, log, tail
        self.partial = b""
        self.after_cr = False
        self.dst_ok = True
        self.activity = activity  # tell podguard of output without a line end (ACTIVITY marks)
        self.told_at = 0.0  # when podguard was last told of it
        self.room = max(64, PIPE_BUF - len(self.prefix) - 1)  # payload bytes per atomic write (marker included)

    def feed(self, data: bytes, final: bool = False) -> None:
        """Emit the complete lines in `data` (and, when `final`, the rest); a line longer than one atomic
        write is passed on in pieces as it comes, never held whole."""
        lines = [(seg, True) for seg in self._split(self.partial + data)]
        if final and self.partial:
            lines.append((self.partial, True))
            self.partial = b""
        while len(self.partial) >= self.room:
            cut = utf8_cut(self.partial, self.room)
            lines.append((self.partial[:cut], False))  # not a line end: the log file keeps the line whole
            self.partial = self.partial[cut:]
        if lines:
            self._emit(lines)
        elif data and self.partial and self.activity:
            self._activity()

    def _activity(self) -> None:
        """Bytes came that end no line (a dot per step): held here until the line ends, so podguard is told that
        this rank wrote, at most once every ACTIVITY_EVERY_S (progress where no --progress is given)."""
        now = time.monotonic()
        if now - self.told_at >= ACTIVITY_EVERY_S:
            self.told_at = now
            self.write(self.prefix + ACTIVITY + b"\n")

    def _split(self, buf: bytes) -> list[bytes]:
        lines: list[bytes] = []
        pos = 0
        for m in _LINE_END.finditer(buf):
            seg = buf[pos : m.start()]
            pos = m.end()
            if self.after_cr and not seg and m.group() == b"\n" and m.start() == 0 and not lines:
                self.after_cr = False  # the \n of a \r\n split across two reads
                continue
            self.after_cr = m.group() == b"\r"
            if seg or m.group() != b"\r":  # an empty progress-bar redraw is dropped
                lines.append(seg)
        self.partial = buf[pos:]
        return lines

    def _emit(self, lines: list[tuple[bytes, bool]]) -> None:
        """Terminal: each line (or piece of one) prefixed, batched into atomic writes. Log: unprefixed."""
        self.log.write(b"".join(seg + b"\n" if complete else seg for seg, complete in lines))
        out: list[bytes] = []
        size = 0
        for line, _ in lines:
            self.tail.append(line.decode("utf-8", "replace"))
            while True:
                piece_len = utf8_cut(line, self.room) if len(line) > self.room else len(line)
                piece = self.prefix + line[:piece_len] + b"\n"
                if size + len(piece) > PIPE_BUF and out:
                    self.write(b"".join(out))
                    out, size = [], 0
                out.append(piece)
                size += len(piece)
                line = line[piece_len:]
                if not line:
                    break
        if out:
            self.write(b"".join(out))

    def write(self, data: bytes) -> None:
        if not self.dst_ok:
            return
        try:
            os.write(self.dst, data)  # <= PIPE_BUF: one atomic write, never interleaved with other ranks
        except OSError:
            self.dst_ok = False  # the reader is gone; keep draining the worker so it never blocks


def utf8_cut(data: bytes, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 character."""
    cut = min(limit, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut or min(limit, len(data))


def _noop(signum: int, frame: object) -> None:
    """torchrun signals the whole process group, so the worker gets every signal directly; the wrapper
    (with a no-op handler, not SIG_IGN, which the worker would inherit) just outlives it to flush."""


def _start(command: tuple[str, ...], env: Mapping[str, str], prefix: bytes):  # -> Popen | int
    child_env = dict(env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env)
    except OSError as exc:
        sys.stderr.write(f"{prefix.decode()}podguard: cannot start {command[0]!r}: {exc.strerror}\n")
        return ExitCode.NOT_FOUND if isinstance(exc, FileNotFoundError) else ExitCode.CANNOT_EXECUTE


def _pump(proc, streams: dict[int, LineStream]) -> tuple[int, float]:
    """Copy the worker's output until its pipes close (or shortly after it exited); (status, exit time)."""
    sel = selectors.DefaultSelector()
    for fd in streams:
        sel.register(fd, selectors.EVENT_READ)
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    status: int | None = None
    exit_time = 0.0
    drain_deadline: float | None = None
    while streams:
        timeout = 0.1 if pidfd is None else None
        if drain_deadline is not None:
            timeout = max(0.0, drain_deadline - time.monotonic())
        for key, _ in sel.select(timeout):
            if key.fd == pidfd:
                sel.unregister(pidfd)
            elif data := os.read(key.fd, 65536):
                streams[key.fd].feed(data)
            else:
                streams.pop(key.fd).feed(b"", final=True)
                sel.unregister(key.fd)
        if status is None and (status := proc.poll()) is not None:
            exit_time = time.time()  # when it ended, not when its output was drained
            drain_deadline = time.monotonic() + DRAIN_AFTER_EXIT_S if streams else None
        if drain_deadline is not None and time.monotonic() >= drain_deadline:
            for stream in streams.values():
                stream.feed(b"", final=True)
            streams.clear()
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    if status is None:
        status = proc.wait()
        exit_time = time.time()
    return status, exit_time


def _record(
    who: RankIdentity, pid: int, status: int, exit_time: float, tail: deque[str], env: Mapping[str, str]
) -> None:
    """podguard_exit.json next to torch's error file: the worker's real exit (best-effort)."""
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    record = {
        "rank": who.rank,
        "local_rank": who.local_rank,
        "group_rank": who.group_rank,
        "nnodes": who.nnodes,
        "pid": pid,
        "exitcode": status if status >= 0 else None,
        "signal": -status if status < 0 else None,
        "time": exit_time,
        "tail": list(tail),
    }
    from podguard.state import write_private  # noqa: PLC0415  lazy: tempfile, socket, redact (~10 ms), after the worker exited, never on each rank's start-up

    with contextlib.suppress(OSError):  # a full volume: the explanation is lost, never the exit code
        write_private(Path(error_file).parent / EXIT_FILE, json.dumps(record))


def _end_like(status: int) -> int:
    """Exit with the worker's code, or die by the worker's signal (torch's bookkeeping stays the same)."""
    if status >= 0:
        return status
    sig = -status
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return signal_exit_code(sig)  # not reached for a deadly signal


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one worker, prefixing its lines, and end exactly as it ended (code or signal)."""
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if not opts.command:
        sys.stderr.write("podguard rank wrapper: no command after --\n")
        return ExitCode.USAGE
    env = os.environ if env is None else env
    who = RankIdentity.from_env(env)
    prefix = who.prefix(opts.prefix, opts.gpus)
    show = opts.show is None or str(who.local_rank) in opts.show

    def warn(text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, prefix + b"podguard: " + text.encode("utf-8", "replace") + b"\n")

    log = RankLog(Path(opts.log_dir) / f"rank{who.rank}.log" if opts.log_dir else None, warn)
    for sig in _FORWARDED:
        signal.signal(sig, _noop)
    proc = _start(opts.command, env, prefix)
    if isinstance(proc, int):
        log.close()
        return proc
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    streams = {
        proc.stdout.fileno(): LineStream(1, prefix, show, log, tail, opts.activity),
        proc.stderr.fileno(): LineStream(2, prefix, show, log, tail, opts.activity),
    }
    status, exit_time = _pump(proc, streams)
    log.close()
    _record(who, proc.pid, status, exit_time, tail, env)
    return _end_like(status)


if __name__ == "__main__":
    sys.exit(main())

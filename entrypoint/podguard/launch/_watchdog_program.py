"""The per-job watchdog program: when podguard dies, stop everything the job started.

    python -I -S _watchdog_program.py JOB_ID GRACE_S      # stdin: the pipe whose other end podguard holds

It reads `g PGID` lines (a worker's process group) from stdin until EOF. `end` before EOF means podguard
finished the job itself: exit quietly. EOF without `end` means podguard died (SIGKILL, OOM killer): every
process that carries `PODGUARD_JOB_ID=JOB_ID` in its environment or belongs to one of the groups gets
SIGTERM (the group leaders already got their parent-death signal), and whatever is left after GRACE_S
gets SIGKILL. Signals go through pidfds after a re-check, so a reused pid is never hit.

Run by path with `-I -S` and the standard library only, never importing podguard: it starts in ~10 ms
beside every job (importing the package and its /proc readers would triple that). Why: docs/supervisor.md.
"""

import os
import signal
import sys
import time

_POLL_S = 0.05
_KILL_WAIT_S = 2.0  # after SIGKILL: how long to keep sweeping for stragglers (and their new children)


def _pgid(pid: int) -> int | None:
    """The process group of a live process; None when it is gone or a zombie (nothing left to stop)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
        fields = raw[raw.rindex(b")") + 2 :].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def _marked(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read().split(b"\0")
    except OSError:
        return False


def _is_target(pid: int, marker: bytes, groups: set[int]) -> bool:
    if pid == os.getpid():
        return False
    pgid = _pgid(pid)
    return pgid is not None and (pgid in groups or _marked(pid, marker))


def _targets(marker: bytes, groups: set[int]) -> list[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [pid for pid in pids if _is_target(pid, marker, groups)]


def _send(pid: int, sig: int, marker: bytes, groups: set[int]) -> None:
    """Signal `pid` through a pidfd, after checking (with the pid pinned) that it is still a target."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        if _is_target(pid, marker, groups):
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _sweep(marker: bytes, groups: set[int], grace_s: float) -> int:
    """SIGTERM, then SIGKILL after the grace; returns how many processes were found at first."""
    found = _targets(marker, groups)
    for pid in found:
        if pid not in groups:  # a group leader got its parent-death signal already
            _send(pid, signal.SIGTERM, marker, groups)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _targets(marker, groups):
        time.sleep(_POLL_S)
    deadline = time.monotonic() + _KILL_WAIT_S
    while time.monotonic() < deadline:
        left = _targets(marker, groups)
        if not left:
            break
        for pid in left:
            _send(pid, signal.SIGKILL, marker, groups)
        time.sleep(_POLL_S)
    return len(found)


def main(argv: list[str]) -> int:
    job_id, grace_s = argv[0], float(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session: only a deliberate kill reaches it
    groups: set[int] = set()
    ended = False
    for line in sys.stdin.buffer:
        word, _, value = line.strip().partition(b" ")
        if word == b"g" and value.isdigit():
            groups.add(int(value))
        elif word == b"end":
            ended = True
    if ended:
        return 0
    marker = f"PODGUARD_JOB_ID={job_id}".encode()
    count = _sweep(marker, groups, grace_s)
    if count:
        sys.stderr.write(f"podguard watchdog: podguard died; stopped {count} process(es) of job {job_id}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

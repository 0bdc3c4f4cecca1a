"""A FUSE file system whose one file never answers a read: a reader blocks in the kernel, past SIGKILL.

    with StallFs(tmp_path / "mnt") as fs:      # None-safe: StallFs.available() says whether it can mount here
        subprocess.Popen(["cat", str(fs.file)])   # blocks in D state in fuse's request_wait_answer
    with StallFs(tmp_path / "mnt", stall_lookups=True) as fs:   # a stalled network volume: any path under it
        (fs.mountpoint / "hang").mkdir()          # blocks (its LOOKUP is never answered)
    # leaving aborts the connection (the reader gets ENOTCONN and exits), then unmounts

Why: a GPU hang leaves processes in uninterruptible sleep in the driver; py-spy or a /proc read of such a process
can block the same way. Once the kernel has sent a READ to the daemon, a reader killed with SIGKILL waits
uninterruptibly for the answer (fs/fuse/dev.c, request_wait_answer), which is what a test of "the job ends
whatever the evidence does" needs. The daemon is a thread of the test process speaking the FUSE protocol over
/dev/fuse (include/uapi/linux/fuse.h); it needs root (mount) and /dev/fuse.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import subprocess
import threading
from pathlib import Path
from types import TracebackType

IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr: 88 bytes
LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT, INTERRUPT, BATCH_FORGET = 1, 2, 3, 14, 15, 18, 25, 26, 36, 42
NO_REPLY = {FORGET, INTERRUPT, BATCH_FORGET}
FOPEN_DIRECT_IO = 1
NAME = "stall"


class StallFs:
    def __init__(self, mountpoint: Path, *, stall_lookups: bool = False) -> None:
        self.mountpoint = mountpoint
        self.stall_lookups = stall_lookups  # also never answer a name's lookup: every path below blocks
        self.file = mountpoint / NAME
        self.fd = -1
        self.reads = 0  # READ requests received (and never answered)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and os.path.exists("/dev/fuse")

    def __enter__(self) -> StallFs:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        libc = ctypes.CDLL(None, use_errno=True)
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if libc.mount(b"stallfs", str(self.mountpoint).encode(), b"fuse", 0, opts) != 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"mount fuse: {os.strerror(err)}")
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)  # (a read in flight would keep the device open: it polls instead)
        with contextlib.suppress(OSError):
            os.close(self.fd)  # the last reference: aborts the connection, waiting requests end with ENOTCONN
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, check=False)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                if not select.select([self.fd], [], [], 0.1)[0]:
                    continue
                data = os.read(self.fd, 1 << 17)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted, EBADF: closed
            _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(data)
            body = data[IN_HEADER.size :]
            if opcode in NO_REPLY:
                continue
            if opcode == READ or (opcode == LOOKUP and self.stall_lookups):
                self.reads += 1
                continue  # never answered
            self._answer(opcode, unique, nodeid, body)

    def _answer(self, opcode: int, unique: int, nodeid: int, body: bytes) -> None:
        error, payload = 0, b""
        if opcode == INIT:
            _major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
            payload = struct.pack("<IIIIHHIIHHI", 7, min(minor, 31), readahead, 0, 16, 12, 4096, 1, 1, 0, 0)
            payload += b"\0" * (64 - len(payload))
        elif opcode == LOOKUP:
            if body.split(b"\0", 1)[0].decode() == NAME:
                payload = struct.pack("<QQQQII", 2, 0, 1, 1, 0, 0) + self._attr(2)
            else:
                error = -errno.ENOENT
        elif opcode == GETATTR:
            payload = struct.pack("<QII", 1, 0, 0) + self._attr(nodeid)
        elif opcode == OPEN:
            payload = struct.pack("<QII", 1, FOPEN_DIRECT_IO, 0)
        elif opcode not in (RELEASE, FLUSH):
            error = -errno.ENOSYS
        with contextlib.suppress(OSError):
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), error, unique) + payload)

    @staticmethod
    def _attr(nodeid: int) -> bytes:
        mode = 0o40755 if nodeid == 1 else 0o100644
        size = 0 if nodeid == 1 else 4096
        return ATTR.pack(nodeid, size, 8, 0, 0, 0, 0, 0, 0, mode, 2 if nodeid == 1 else 1, 0, 0, 0, 4096, 0)

"""What a stack dump is: a frame, a thread's stack, one rank's stacks, and which files are the user's code.

The records that the capture (stacks.py) fills and the verdict (verdict.py) reads; neither imports the other's
work through them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from podguard.launch.watch.ranks import StackTarget

__all__ = ["Frame", "RankStacks", "ThreadStack", "is_user_file"]

_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/torch/", "/podguard/")
_STDLIB = re.compile(r"/lib(64)?/python[0-9.]+/")


# --------------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # full path as the target sees it
    line: int
    short_file: str = ""  # py-spy's package-relative name, e.g. "torch/distributed/distributed_c10d.py"

    @property
    def is_user(self) -> bool:
        """In the user's code: not torch, site-packages, the standard library, podguard or frozen modules."""
        return is_user_file(self.file)

    def where(self) -> str:
        """'train.py:42 in step'."""
        return f"{self.short_file or os.path.basename(self.file)}:{self.line} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int  # the OS thread id (the pid for the main thread)
    name: str | None
    active: bool  # False: idle (waiting, sleeping, blocked in a call)
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class RankStacks:
    target: StackTarget
    path: Path | None  # the human-readable dump under out_dir
    threads: tuple[ThreadStack, ...]
    innermost_user_frame: str | None  # "train.py:42 in step", of the main thread (else the first with one)
    error: str | None  # why there are no stacks: one line with the cause and the fix
    duration_ms: float
    collective: str | None = None  # the torch.distributed call the main thread waits in, e.g. "all_reduce"
    stopped: bool = False  # the process was stopped (state T: a SIGSTOP, a debugger) when its stacks were taken


def is_user_file(path: str) -> bool:
    """True for the user's own source files (see Frame.is_user)."""
    if not path or path.startswith("<frozen") or path.startswith("<built-in"):
        return False
    normal = path.replace("\\", "/")
    return not any(part in normal for part in _LIBRARY_PARTS) and not _STDLIB.search(normal)

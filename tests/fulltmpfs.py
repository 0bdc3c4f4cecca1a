"""A tiny tmpfs filled to its last block: a full disk for the tests (root only).

with full_tmpfs(tmp_path / "full") as path:     # pytest.skip where it cannot be mounted
    ...                                           # every write under path fails with ENOSPC
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def full_tmpfs(path: Path) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        fd = os.open(path / "fill", os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError):
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)

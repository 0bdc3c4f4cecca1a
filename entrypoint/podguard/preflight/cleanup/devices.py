"""The NVIDIA device files of a dev dir (`nvidiactl`, `nvidia<N>`, `nvidia-caps/*`), indexed every way an
open fd may name them (path, resolved path, inode, character-device number).

    files = find_device_files("/dev")
    files.match_link("/dev/nvidia0")  # "nvidia0"
    gpu_minor("nvidia3")               # 3
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_DEV_DIR", "ENV_DEV_DIR", "NvidiaDeviceFiles", "find_device_files", "gpu_minor", "resolve_dev_dir"]

ENV_DEV_DIR = "PODGUARD_DEV_DIR"
DEFAULT_DEV_DIR = "/dev"

_GPU_DEVICE = re.compile(r"^nvidia(\d+)$")


def resolve_dev_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the NVIDIA device files live: the explicit value, else `$PODGUARD_DEV_DIR`, else `/dev`."""
    raw = explicit if explicit not in (None, "") else os.environ.get(ENV_DEV_DIR) or DEFAULT_DEV_DIR
    return Path(raw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NvidiaDeviceFiles:
    """The NVIDIA device files found in a dev dir.

    `paths` maps both the path as listed and its resolved form to the device name (`nvidia0`,
    `nvidiactl`, `nvidia-uvm`, `nvidia-caps/nvidia-cap1`, ...). `inodes` maps `(st_dev, st_ino)` and
    `rdevs` maps a character device's `st_rdev` to the same name.
    """

    dev_dir: str
    paths: Mapping[str, str] = field(default_factory=dict)
    inodes: Mapping[tuple[int, int], str] = field(default_factory=dict)
    rdevs: Mapping[int, str] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.paths.values())))

    def match_link(self, target: str) -> str | None:
        """The device name for an fd's link text, without any syscall; None if it is not one of ours."""
        return self.paths.get(target)

    def worth_stat(self, target: str) -> bool:
        """Whether an fd whose link text did not match could still be one of our devices."""
        if not target.startswith("/"):
            return False  # socket:[..], pipe:[..], anon_inode:..
        return target.startswith("/dev/") or os.path.basename(target).startswith("nvidia")

    def match_stat(self, st: os.stat_result) -> str | None:
        if stat_mod.S_ISCHR(st.st_mode) and st.st_rdev in self.rdevs:
            return self.rdevs[st.st_rdev]
        return self.inodes.get((st.st_dev, st.st_ino))


def gpu_minor(device: str) -> int | None:
    """`nvidia3` -> 3; None for `nvidiactl`, `nvidia-uvm` and the like (they are not one GPU)."""
    m = _GPU_DEVICE.match(device)
    return int(m.group(1)) if m else None


def find_device_files(dev_dir: str | os.PathLike[str] | None = None) -> NvidiaDeviceFiles:
    """List `<dev_dir>/nvidia*` (and `<dev_dir>/nvidia-caps/*`). A missing dir gives an empty set."""
    root = resolve_dev_dir(dev_dir)
    paths: dict[str, str] = {}
    inodes: dict[tuple[int, int], str] = {}
    rdevs: dict[int, str] = {}

    def add(path: str, name: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if stat_mod.S_ISDIR(st.st_mode):
            return
        paths[path] = name
        paths[os.path.realpath(path)] = name
        inodes[(st.st_dev, st.st_ino)] = name
        if stat_mod.S_ISCHR(st.st_mode):
            rdevs[st.st_rdev] = name

    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.startswith("nvidia"):
            continue
        full = os.path.join(root, entry)
        if entry == "nvidia-caps" and os.path.isdir(full):
            for cap in sorted(os.listdir(full)):
                add(os.path.join(full, cap), f"nvidia-caps/{cap}")
            continue
        add(full, entry)
    return NvidiaDeviceFiles(dev_dir=str(root), paths=paths, inodes=inodes, rdevs=rdevs)

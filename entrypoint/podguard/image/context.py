"""The build context `podguard image build` sends: an explicit list of files, streamed as a tar.

Only the Dockerfile, docker/rootfs/ and the wheels go to the engine: nothing else from the checkout (a
`.env`, `~/.runpod`, a virtualenv, logs that may carry an index URL) can reach a layer. The same set is
what `.dockerignore` lets through for a plain `docker build`. `--torch base` builds send
docker/torch-base.Dockerfile and the torch-less wheelhouse (deps-base) instead.

    ctx = BuildContext.collect(root)                    # or BuildContext.collect(root, torch_base=True)
    for chunk in ctx.stream(on_progress=lambda sent, total: ...): ...
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from podguard.errors import UsageError

__all__ = ["CHUNK", "DOCKERFILE", "TORCH_BASE_DOCKERFILE", "BuildContext"]

CHUNK = 1 << 20
FIXED_MTIME = 315532800  # 1980-01-01: unchanged files keep Docker's layer cache whatever their checkout time
_INCLUDED_TREES = ("docker/rootfs",)
DOCKERFILE = "Dockerfile"
TORCH_BASE_DOCKERFILE = "docker/torch-base.Dockerfile"
_WHEEL_DIRS = ("docker/wheelhouse/app", "docker/wheelhouse/deps")
_TORCH_BASE_WHEEL_DIRS = ("docker/wheelhouse/app", "docker/wheelhouse/deps-base")


@dataclass(frozen=True)
class BuildContext:
    root: Path
    files: tuple[str, ...]  # paths relative to root, in tar order
    dockerfile: str = DOCKERFILE

    @classmethod
    def collect(cls, root: Path, *, torch_base: bool = False) -> BuildContext:
        """The files to send; a missing wheelhouse is a usage error naming the script that makes it."""
        dockerfile = TORCH_BASE_DOCKERFILE if torch_base else DOCKERFILE
        files = [dockerfile]
        for tree in _INCLUDED_TREES:
            for path in sorted((root / tree).rglob("*")):
                if path.is_file() or path.is_symlink():
                    files.append(path.relative_to(root).as_posix())
        for folder in _TORCH_BASE_WHEEL_DIRS if torch_base else _WHEEL_DIRS:
            wheels = sorted((root / folder).glob("*.whl"))
            if not wheels:
                raise UsageError(f"no wheels in {root / folder}: run docker/build-wheelhouse.sh first")
            files += [w.relative_to(root).as_posix() for w in wheels]
        return cls(root, tuple(files), dockerfile)

    @property
    def size(self) -> int:
        """Bytes of file content (the tar adds a little)."""
        return sum((self.root / f).lstat().st_size for f in self.files)

    def _add(self, tar: tarfile.TarFile, rel: str) -> None:
        info = tar.gettarinfo(str(self.root / rel), arcname=rel)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = FIXED_MTIME
        if info.isreg():
            with open(self.root / rel, "rb") as fh:
                tar.addfile(info, fh)
        else:
            tar.addfile(info)

    def stream(self, on_progress: Callable[[int, int], None] | None = None) -> Iterator[bytes]:
        """The context as an uncompressed tar, produced while it is sent (no copy on disk)."""
        read_fd, write_fd = os.pipe()
        failure: list[BaseException] = []

        def produce() -> None:
            try:
                with os.fdopen(write_fd, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
                    for rel in self.files:
                        self._add(tar, rel)
            except BrokenPipeError:
                pass  # the consumer stopped reading (the engine refused the build)
            except BaseException as exc:
                failure.append(exc)

        total = self.size
        thread = threading.Thread(target=produce, name="podguard-context", daemon=True)
        thread.start()
        sent = 0
        with os.fdopen(read_fd, "rb") as source:
            while chunk := source.read(CHUNK):
                sent += len(chunk)
                if on_progress is not None:
                    on_progress(min(sent, total), total)
                yield chunk
        thread.join()
        if failure:
            raise failure[0]

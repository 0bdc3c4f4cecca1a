"""A fake GPU node for one test: scenario file, device files, process registry, environment.

Why one object: every NVML-level test needs the same four things set up consistently (the scenario the
fake reads, the `/dev`-like folder holders keep open, the registry of live GPU processes, and the
environment that points the library, the fake and podguard at them). `tests/conftest.py` builds it in
the `nvml_node` fixture; tests that want a second node can build one directly.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .build import LIBRARY_NAME
from .gpuproc import register_process, unregister_process
from .holders import GpuHolder, spawn_gpu_holder
from .scenario import Scenario, healthy_h100

# Env vars the node sets. PODGUARD_NVML_LIBRARY is only for THIS process (see `NvmlNode.env`).
ENV_LIBRARY = "PODGUARD_NVML_LIBRARY"


def sync_dev_dir(dev_dir: Path, scenario: Scenario) -> None:
    """Make `dev_dir` look like /dev for `scenario`: nvidiactl, nvidia-uvm and nvidia<minor> per GPU.

    Files of GPUs that are no longer in the scenario are removed (a holder keeping one open is fine)."""
    dev_dir.mkdir(parents=True, exist_ok=True)
    wanted = {"nvidiactl", "nvidia-uvm"} | {f"nvidia{g.minor}" for g in scenario.gpus}
    for name in wanted:
        (dev_dir / name).touch()
    for path in dev_dir.glob("nvidia[0-9]*"):
        if path.name not in wanted:
            path.unlink()


@dataclass
class NvmlNode:
    """A fake GPU node. `env` is for subprocesses (LD_LIBRARY_PATH route, like a real user)."""

    root: Path
    lib_dir: Path
    scenario: Scenario = field(default_factory=healthy_h100)
    holders: list[GpuHolder] = field(default_factory=list)
    backends: list[Any] = field(default_factory=list)

    @property
    def scenario_path(self) -> Path:
        return self.root / "scenario.txt"

    @property
    def dev_dir(self) -> Path:
        return self.root / "dev"

    @property
    def procs_dir(self) -> Path:
        return self.root / "procs"

    @property
    def library(self) -> Path:
        return self.lib_dir / LIBRARY_NAME

    def env_vars(self) -> dict[str, str]:
        """What the node adds to the environment (the fixture applies it with monkeypatch)."""
        ld = os.environ.get("LD_LIBRARY_PATH", "")
        parts = [str(self.lib_dir)] + [p for p in ld.split(os.pathsep) if p and p != str(self.lib_dir)]
        return {
            "LD_LIBRARY_PATH": os.pathsep.join(parts),
            "FAKE_NVML_SCENARIO": str(self.scenario_path),
            "FAKE_NVML_PROCS_DIR": str(self.procs_dir),
            "PODGUARD_DEV_DIR": str(self.dev_dir),
            ENV_LIBRARY: str(self.library),
        }

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus the node's variables, WITHOUT PODGUARD_NVML_LIBRARY: a child process finds the
        fake through LD_LIBRARY_PATH exactly as a real user's process finds the driver's library."""
        env = {**os.environ, **self.env_vars()}
        env.pop(ENV_LIBRARY, None)
        return env

    def write(self, scenario: Scenario | None = None) -> Scenario:
        """Install `scenario` (or re-write the current, mutated one); device files follow the GPUs."""
        if scenario is not None:
            self.scenario = scenario
        self.procs_dir.mkdir(parents=True, exist_ok=True)
        sync_dev_dir(self.dev_dir, self.scenario)
        self.scenario.write(self.scenario_path)
        return self.scenario

    def spawn_holder(self, gpu: int, mem_mib: int, **kwargs: Any) -> GpuHolder:
        """`spawn_gpu_holder` on this node; killed at teardown. kwargs as spawn_gpu_holder."""
        kwargs.setdefault("env", self.env)
        holder = spawn_gpu_holder(gpu, mem_mib, self.dev_dir, self.procs_dir, **kwargs)
        self.holders.append(holder)
        return holder

    def register(self, pid: int, gpu: int, mem_mib: int, **kwargs: Any) -> Path:
        """Register an arbitrary local process as a GPU process (it must stay alive to be listed)."""
        return register_process(self.procs_dir, pid, gpu, mem_mib, **kwargs)

    def unregister(self, pid: int) -> None:
        unregister_process(self.procs_dir, pid)

    def backend(self, **kwargs: Any) -> Any:
        """An in-process `NvmlBackend` bound to this node's fake library; closed at teardown."""
        from podguard.gpu.nvml import NvmlBackend

        kwargs.setdefault("library_path", str(self.library))
        backend = NvmlBackend(**kwargs)
        self.backends.append(backend)
        return backend

    def teardown(self) -> None:
        for backend in self.backends:
            with contextlib.suppress(Exception):
                backend.close()
        for holder in self.holders:
            holder.kill_all()
        _kill_strays(str(self.root))


def _kill_strays(marker: str) -> None:
    """SIGKILL what this node's holders left behind: a worker a respawning parent started just before it was
    killed is known to nobody, but its command line names this node's folders (and nothing else's does)."""
    import signal

    needle = marker.encode()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle in fh.read():
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue

"""In-Python fakes of the accelerator backend, for unit tests that do not need the real binding.

The end-to-end tests use the real `nvidia-ml-py` against the C fake in `tests/fakenvml/`; these fakes
only make the pure logic (selection, gate rules, cleanup planning) quick to test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from podguard.gpu.backend import DriverInfo, GpuProcess, GpuSnapshot, XidEvent

GIB = 1 << 30


def h100(index: int, **overrides: object) -> GpuSnapshot:
    base = GpuSnapshot(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-00000000-0000-0000-0000-{index:012d}",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        minor_number=index,
        memory_total=80 * GIB,
        memory_used=0,
        memory_reserved=512 << 20,
        memory_free=80 * GIB,
        utilization_gpu=0,
        utilization_memory=0,
        temperature_c=35,
        temperature_slowdown_c=87,
        pcie_link_width=16,
        pcie_link_width_max=16,
        persistence_mode=True,
        mig_enabled=False,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


@dataclass
class FakeBackend:
    """A mutable in-memory GPU node. Processes whose PID is dead stop counting, like the real driver."""

    gpus: list[GpuSnapshot] = field(default_factory=list)
    driver_info: DriverInfo = field(default_factory=lambda: DriverInfo("550.54.15", "12.4", "12.550.54.15"))
    xids: list[XidEvent] = field(default_factory=list)
    closed: bool = False

    @classmethod
    def healthy(cls, count: int = 8) -> FakeBackend:
        return cls(gpus=[h100(i) for i in range(count)])

    def driver(self) -> DriverInfo:
        return self.driver_info

    def device_count(self) -> int:
        return len(self.gpus)

    def _live(self, procs: tuple[GpuProcess, ...]) -> tuple[GpuProcess, ...]:
        return tuple(p for p in procs if _alive(p.pid))

    def snapshot(self, index: int) -> GpuSnapshot:
        gpu = self.gpus[index]
        procs = self._live(gpu.processes)
        used = self.memory_used(index)
        free = None if gpu.memory_total is None or used is None else gpu.memory_total - used
        return replace(gpu, processes=procs, memory_used=used, memory_free=free)

    def memory_used(self, index: int) -> int | None:
        gpu = self.gpus[index]
        if gpu.memory_used is None:
            return None
        return gpu.memory_used + sum(p.used_memory or 0 for p in self._live(gpu.processes))

    def utilization(self, index: int) -> int | None:
        return self.gpus[index].utilization_gpu

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        return self._live(self.gpus[index].processes)

    def watch_xid(self, indices: list[int], timeout_s: float, stop: object = None) -> list[XidEvent]:
        return [e for e in self.xids if e.gpu_index in indices]

    def close(self) -> None:
        self.closed = True

    def set(self, index: int, **changes: object) -> None:
        self.gpus[index] = replace(self.gpus[index], **changes)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")

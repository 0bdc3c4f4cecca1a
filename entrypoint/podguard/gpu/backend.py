"""The accelerator backend: a small Protocol and the frozen records it returns.

    backend = open_backend()          # podguard.gpu.factory; None on a CPU-only node
    snap = backend.snapshot(0)        # GpuSnapshot: memory in bytes, None = "n/a"
    backend.processes(0, mig="MIG-...")  # GpuQueryError when NVML cannot tell
    backend.health(0)                 # GpuHealth: the run-time watch's cheap poll (lost, ECC, recovery action)
    events = backend.open_xid_events([0, 1]); events.poll(); events.close()   # Xid events without blocking

Everything above this layer talks to a `GpuBackend`, never to NVML (docs/gate.md, "Backend").
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from podguard.records import Record

__all__ = [
    "CLOCK_EVENT_BITS",
    "NVML_FAILURE_ADVICE",
    "ComputeMode",
    "DriverInfo",
    "EccState",
    "GpuBackend",
    "GpuHealth",
    "GpuProcess",
    "GpuQueryError",
    "GpuSnapshot",
    "MigDevice",
    "NvmlFailure",
    "NvmlUnavailable",
    "XidEvent",
    "XidSubscription",
    "decode_clock_events",
]


class NvmlFailure(StrEnum):
    """Why NVML could not be initialised; each kind has its own advice for the user."""

    LIBRARY_NOT_FOUND = "library_not_found"  # no libnvidia-ml.so.1: no driver, a CPU-only node
    DRIVER_NOT_LOADED = "driver_not_loaded"  # library present, kernel module not loaded
    VERSION_MISMATCH = "version_mismatch"  # driver/library version mismatch (container vs host)
    GPU_LOST = "gpu_lost"  # a GPU fell off the bus
    NO_PERMISSION = "no_permission"
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    UNKNOWN = "unknown"


NVML_FAILURE_ADVICE: dict[NvmlFailure, str] = {
    NvmlFailure.LIBRARY_NOT_FOUND: "no NVIDIA driver library (libnvidia-ml.so.1) here: this is a CPU-only node, "
    "or the container was started without the GPU runtime (docker run --gpus all)",
    NvmlFailure.DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded: the host needs the driver or a reboot",
    NvmlFailure.VERSION_MISMATCH: "driver/library version mismatch: the user-space driver in the image does not "
    "match the host's kernel driver; do not install NVIDIA drivers inside the image, restart the pod",
    NvmlFailure.GPU_LOST: "a GPU has fallen off the bus: restart the pod, or move to another machine",
    NvmlFailure.NO_PERMISSION: "no permission to talk to the NVIDIA driver (device files not accessible)",
    NvmlFailure.INSUFFICIENT_RESOURCES: "the driver ran out of resources while initialising NVML",
    NvmlFailure.UNKNOWN: "NVML failed to initialise",
}


class NvmlUnavailable(Exception):
    """NVML could not be initialised. `kind` classifies why; `detail` is NVML's own text."""

    def __init__(self, kind: NvmlFailure, detail: str = "") -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(self.message)

    @property
    def message(self) -> str:
        advice = NVML_FAILURE_ADVICE[self.kind]
        return f"{advice} ({self.detail})" if self.detail else advice


class GpuQueryError(Exception):
    """NVML could not answer a query whose answer matters (a process list): the state is unknown, not empty.

    `code` is the NVML error name (NO_PERMISSION, NOT_SUPPORTED, GPU_IS_LOST, ...)."""

    def __init__(self, what: str, code: str, detail: str = "") -> None:
        self.what = what
        self.code = code
        self.detail = detail
        super().__init__(f"{what}: NVML answered {code}" + (f" ({detail})" if detail else ""))


class ComputeMode(StrEnum):
    DEFAULT = "default"
    EXCLUSIVE_THREAD = "exclusive_thread"
    PROHIBITED = "prohibited"
    EXCLUSIVE_PROCESS = "exclusive_process"


@dataclass(frozen=True)
class DriverInfo:
    driver_version: str | None
    cuda_driver_version: str | None  # "12.4" form
    nvml_version: str | None


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML says has a context on a GPU. `pid` may be a host PID (another PID namespace)."""

    pid: int
    used_memory: int | None
    kind: str  # "compute" or "graphics"
    mig: str | None = None  # the MIG device it runs on, when it was listed per MIG device


@dataclass(frozen=True)
class EccState:
    enabled: bool | None = None
    uncorrected_volatile: int | None = None
    corrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    # Lifetime counts (NVML_AGGREGATE_ECC): history for `doctor`; the gate uses the volatile ones.
    uncorrected_aggregate: int | None = None
    corrected_aggregate: int | None = None


@dataclass(frozen=True)
class MigDevice:
    uuid: str  # "MIG-..." as CUDA_VISIBLE_DEVICES takes it
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    unknown: tuple[str, ...] = ()  # what NVML could not answer for this MIG device (see GpuSnapshot.unknown)


@dataclass(frozen=True)
class GpuSnapshot(Record):
    """Everything podguard knows about one GPU at one moment."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    minor_number: int | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    memory_reserved: int | None = None
    memory_free: int | None = None
    utilization_gpu: int | None = None  # percent
    utilization_memory: int | None = None  # percent
    processes: tuple[GpuProcess, ...] = ()
    compute_mode: ComputeMode | None = None
    persistence_mode: bool | None = None
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    ecc: EccState = field(default_factory=EccState)
    clock_event_reasons: int | None = None  # raw NVML bitmask
    clock_event_names: tuple[str, ...] = ()  # decoded, e.g. ("hw_slowdown", "sw_thermal")
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_link_gen: int | None = None  # drops at idle by design (power saving): shown, never judged
    pcie_link_gen_max: int | None = None
    nvlink_links: int | None = None  # NVLink links the GPU has; None: no NVLink (or not reported)
    nvlink_active: int | None = None  # of those, how many are up
    recovery_action: str | None = None  # None / "none" / "reset" / "reboot" / "drain_p2p" ...
    lost: bool = False  # NVML said GPU_IS_LOST for this device
    errors: tuple[str, ...] = ()  # queries that failed unexpectedly (not merely unsupported)
    # Memory or process queries NVML could not answer ("processes: NO_PERMISSION"): the GPU's state is
    # unknown, not idle (a MIG parent in an unprivileged container answers so; its MIG devices may not).
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int
    timestamp: float  # time.time() when seen


@dataclass(frozen=True)
class GpuHealth:
    """What the run-time GPU watch polls on one GPU (`GpuBackend.health`): a few cheap NVML queries.

    None = NVML could not tell; `unknown` says which query did not answer and why ("ecc: NOT_SUPPORTED")."""

    index: int
    lost: bool = False  # NVML answered GPU_IS_LOST
    ecc_uncorrected_volatile: int | None = None
    recovery_action: str | None = None  # as GpuSnapshot.recovery_action: "none", "reset", "reboot", ...
    unknown: tuple[str, ...] = ()


class XidSubscription(Protocol):
    """Critical Xid events on some GPUs from one long-lived NVML event set (`GpuBackend.open_xid_events`)."""

    indices: tuple[int, ...]  # the GPUs whose events arrive here
    unwatched: dict[int, str]  # GPUs that could not be registered -> NVML's error name
    failure: str | None  # the last poll's event-wait error (None: it answered)

    def poll(self) -> list[XidEvent]:
        """The events that arrived since the last poll, at once (a wait with a 0 ms timeout); never blocks."""
        ...

    def close(self) -> None: ...


# Clock event reason bits (nvml.h nvmlClocksEventReason*), decoded into stable names.
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}


def decode_clock_events(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit)


@runtime_checkable
class GpuBackend(Protocol):
    """What podguard needs from the accelerator. Implementations: `NvmlBackend`, test fakes.

    Construction performs initialisation and raises `NvmlUnavailable` when there is no usable driver.
    """

    def driver(self) -> DriverInfo: ...

    def device_count(self) -> int: ...

    def snapshot(self, index: int) -> GpuSnapshot:
        """Full state of one GPU. Never raises for an unsupported field; a lost GPU gives `lost=True`."""
        ...

    def memory_used(self, index: int, mig: str | None = None) -> int | None:
        """Cheap poll used while waiting for memory to come back after a cleanup (of one MIG device of the
        GPU when `mig` names it); None when NVML cannot tell (unknown, never "free")."""
        ...

    def utilization(self, index: int) -> int | None:
        """Cheap poll of the GPU's utilisation in percent (NVML's last sample period; no CUDA context), used by
        the idle guard; None when NVML cannot tell (MIG mode, not supported, a lost GPU): unknown, never idle."""
        ...

    def processes(self, index: int, mig: str | None = None) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes with a context on this GPU (or on its MIG device `mig`), a cheap
        poll. Raises `GpuQueryError` when the list cannot be read: an unreadable list is not an empty one."""
        ...

    def watch_xid(self, indices: list[int], timeout_s: float, stop: threading.Event | None = None) -> list[XidEvent]:
        """Critical XID events seen on these GPUs until `timeout_s` passes or `stop` is set ([] if unsupported).

        Waits in slices of at most 100 ms so a set `stop` ends the watch promptly.
        """
        ...

    def health(self, index: int) -> GpuHealth:
        """Cheap run-time health of one GPU (lost, uncorrected volatile ECC count, the driver's recovery action):
        at most three NVML calls, no CUDA context. Never raises for a query NVML cannot answer (`unknown`)."""
        ...

    def open_xid_events(self, indices: Sequence[int]) -> XidSubscription | None:
        """An event set kept open for critical Xid events on these GPUs, polled without blocking; None when
        NVML has no event API here (or no GPU could be registered)."""
        ...

    def close(self) -> None: ...

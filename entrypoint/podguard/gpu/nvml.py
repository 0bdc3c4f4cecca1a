"""`NvmlBackend`: the `GpuBackend` on the real NVML binding (`nvidia-ml-py`, imported as `pynvml`).

    with NvmlBackend() as nvml:          # or NvmlBackend(library_path=...), env PODGUARD_NVML_LIBRARY
        nvml.snapshot(0).memory_used

NVML only, in-process, no CUDA context; `pynvml` is imported when a backend is built. Every per-field
query degrades to n/a; memory and process queries that cannot be answered are *unknown*, never "free".
This module keeps the session (init, handles, what a GPU cannot answer); the stateless reads of one device
handle (processes, ECC, the recovery action, NVLink) are `gpu/nvml_reads.py`, the Xid events `gpu/nvml_events.py`.
Why these choices and how the library is found: docs/gate.md ("Backend").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from podguard.gpu import nvml_reads as reads
from podguard.gpu.backend import (
    DriverInfo,
    GpuHealth,
    GpuProcess,
    GpuQueryError,
    GpuSnapshot,
    MigDevice,
    NvmlFailure,
    NvmlUnavailable,
    XidEvent,
    XidSubscription,
    decode_clock_events,
)
from podguard.gpu.nvml_events import open_xid_subscription, watch_xid
from podguard.gpu.nvml_support import (
    COMPUTE_MODES,
    ENV_LIBRARY,
    NOT_AVAILABLE_CODES,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_FEATURE_ENABLED,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    NVML_FI_DEV_NVLINK_LINK_COUNT,
    Reader,
    classify_init_error,
    describe_error,
    error_code,
    error_name,
    format_cuda_version,
    import_pynvml,
    text_of,
    unknown_fields,
)

if TYPE_CHECKING:
    import threading

__all__ = ["ENV_LIBRARY", "NvmlBackend", "classify_init_error", "format_cuda_version"]


class NvmlBackend:
    """`GpuBackend` over NVML. Construction initialises NVML or raises `NvmlUnavailable`."""

    def __init__(self, library_path: str | os.PathLike[str] | None = None) -> None:
        self._closed = True
        path = os.fspath(library_path) if library_path else os.environ.get(ENV_LIBRARY) or None
        self._nv = import_pynvml(path)
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            code = error_code(exc)
            raise NvmlUnavailable(classify_init_error(code), describe_error(exc)) from None
        except OSError as exc:  # defensive: a loader error surfacing from ctypes
            raise NvmlUnavailable(NvmlFailure.LIBRARY_NOT_FOUND, str(exc)) from None
        self._closed = False
        self._handles: dict[int, Any] = {}
        self._mig_handles: dict[str, Any] = {}
        self._count: int | None = None
        self._nvlink_links: dict[int, int | None] = {}  # GPU -> NVLink link count (hardware: read once)
        self._memory_v1 = False  # the driver lacks nvmlDeviceGetMemoryInfo_v2: use v1 from then on
        self._health_na: dict[int, dict[str, str]] = {}  # GPU -> health query it cannot answer -> why (not asked again)

    # -- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut NVML down once (pynvml reference-counts init/shutdown)."""
        if self._closed:
            return
        self._closed = True
        self._handles.clear()
        self._mig_handles.clear()
        self._nvlink_links.clear()
        self._health_na.clear()
        with contextlib.suppress(Exception):
            self._nv.nvmlShutdown()

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- system ----------------------------------------------------------------------------------------

    def driver(self) -> DriverInfo:
        r = Reader(self._nv)
        cuda = r.first(
            "cuda_driver_version", ("nvmlSystemGetCudaDriverVersion_v2",), ("nvmlSystemGetCudaDriverVersion",)
        )
        return DriverInfo(
            driver_version=text_of(r.call("driver_version", "nvmlSystemGetDriverVersion")),
            cuda_driver_version=format_cuda_version(cuda),
            nvml_version=text_of(r.call("nvml_version", "nvmlSystemGetNVMLVersion")),
        )

    def device_count(self) -> int:
        """Number of GPUs NVML sees. Raises NvmlUnavailable if NVML cannot even count (never a silent 0:
        that would look like a CPU-only node)."""
        if self._count is None:
            try:
                self._count = int(self._nv.nvmlDeviceGetCount())
            except self._nv.NVMLError as exc:
                raise NvmlUnavailable(classify_init_error(error_code(exc)), describe_error(exc)) from None
        return self._count

    # -- per GPU ---------------------------------------------------------------------------------------

    def _check_index(self, index: int) -> None:
        count = self.device_count()
        if not 0 <= index < count:
            valid = f"0..{count - 1}" if count else "none (no GPU)"
            raise IndexError(f"GPU index {index} out of range (valid: {valid})")

    def _handle(self, index: int, reader: Reader | None = None) -> Any:
        handle = self._handles.get(index)
        if handle is not None:
            return handle
        try:
            handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        except self._nv.NVMLError as exc:
            if reader is not None:
                reader.record("handle", exc)
            return None
        self._handles[index] = handle
        return handle

    def snapshot(self, index: int) -> GpuSnapshot:
        self._check_index(index)
        nv = self._nv
        r = Reader(nv)
        h = self._handle(index, r)
        if h is None:
            return GpuSnapshot(index=index, lost=r.lost, errors=tuple(r.errors))
        pci = r.call("pci", "nvmlDeviceGetPciInfo_v3", h)
        memory = self._memory(h, r)
        processes = reads.processes(h, r)
        util = r.call("utilization", "nvmlDeviceGetUtilizationRates", h)
        mode = r.call("compute_mode", "nvmlDeviceGetComputeMode", h)
        persistence = r.call("persistence_mode", "nvmlDeviceGetPersistenceMode", h)
        mig = r.call("mig_mode", "nvmlDeviceGetMigMode", h)
        mig_enabled = None if mig is None else mig[0] == NVML_DEVICE_MIG_ENABLE
        clocks = r.first(
            "clock_event_reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", h),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", h),
        )
        recovery, nvlink_links = self._field_values(index, h, r)
        return GpuSnapshot(
            index=index,
            name=text_of(r.call("name", "nvmlDeviceGetName", h)),
            uuid=text_of(r.call("uuid", "nvmlDeviceGetUUID", h)),
            pci_bus_id=text_of(pci.busId) if pci is not None else None,
            minor_number=r.call("minor_number", "nvmlDeviceGetMinorNumber", h),
            memory_total=memory[0],
            memory_used=memory[1],
            memory_reserved=memory[2],
            memory_free=memory[3],
            utilization_gpu=util.gpu if util is not None else None,
            utilization_memory=util.memory if util is not None else None,
            processes=processes or (),
            compute_mode=COMPUTE_MODES.get(mode) if mode is not None else None,
            persistence_mode=None if persistence is None else persistence == NVML_FEATURE_ENABLED,
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(h, r) if mig_enabled else (),
            ecc=reads.ecc_state(h, r),
            clock_event_reasons=clocks,
            clock_event_names=decode_clock_events(clocks),
            temperature_c=r.call("temperature", "nvmlDeviceGetTemperature", h, 0),  # NVML_TEMPERATURE_GPU
            temperature_slowdown_c=r.call(
                "temperature_slowdown",
                "nvmlDeviceGetTemperatureThreshold",
                h,
                1,  # ..._THRESHOLD_SLOWDOWN
            ),
            pcie_link_width=r.call("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_link_width_max=r.call("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", h),
            pcie_link_gen=r.call("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_link_gen_max=r.call("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h),
            nvlink_links=nvlink_links,
            nvlink_active=reads.nvlink_active(h, r, nvlink_links) if nvlink_links else None,
            recovery_action=recovery,
            lost=r.lost,
            errors=tuple(r.errors),
            unknown=unknown_fields(r, memory[1], processes),
        )

    def _memory(self, h: Any, r: Reader) -> tuple[int | None, int | None, int | None, int | None]:
        """(total, used, reserved, free). v2 separates the driver's reserved memory; v1 (old drivers)
        folds it into `used`, so `reserved` is n/a there."""
        nv = self._nv
        if not self._memory_v1:
            version = getattr(nv, "nvmlMemory_v2", None)
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                return m.total, m.used, m.reserved, m.free
            except nv.NVMLError as exc:
                if error_code(exc) not in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                    r.record("memory", exc)
                    return None, None, None, None
                self._memory_v1 = True
            except TypeError:  # a binding without the `version` argument
                self._memory_v1 = True
        m = r.call("memory", "nvmlDeviceGetMemoryInfo", h)
        if m is None:
            return None, None, None, None
        return m.total, m.used, None, m.free

    def _mig_devices(self, h: Any, r: Reader) -> tuple[MigDevice, ...]:
        slots = r.call("mig_devices", "nvmlDeviceGetMaxMigDeviceCount", h) or 0
        devices = []
        for slot in range(slots):
            mh = r.call("mig_device", "nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
            if mh is None:
                continue  # NOT_FOUND: an empty slot
            uuid = text_of(r.call("mig_uuid", "nvmlDeviceGetUUID", mh))
            if not uuid:
                continue
            self._mig_handles[uuid] = mh
            mr = Reader(self._nv)  # a slice's failures are its own, not the parent's
            memory = self._memory(mh, mr)
            processes = reads.processes(mh, mr, uuid)
            devices.append(
                MigDevice(
                    uuid=uuid,
                    gpu_instance_id=r.call("mig_gpu_instance", "nvmlDeviceGetGpuInstanceId", mh),
                    compute_instance_id=r.call("mig_compute_instance", "nvmlDeviceGetComputeInstanceId", mh),
                    memory_total=memory[0],
                    memory_used=memory[1],
                    processes=processes or (),
                    unknown=unknown_fields(mr, memory[1], processes),
                )
            )
        return tuple(devices)

    def _field_values(self, index: int, h: Any, r: Reader) -> tuple[str | None, int | None]:
        """(recovery action, NVLink link count) in one nvmlDeviceGetFieldValues call; the link count only the
        first time (it is the hardware's). A GPU without NVLink answers NOT_SUPPORTED for it: None, no error."""
        field_id = getattr(self._nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
        known = index in self._nvlink_links
        fields = [field_id] if known else [field_id, NVML_FI_DEV_NVLINK_LINK_COUNT]
        values = r.call("recovery_action", "nvmlDeviceGetFieldValues", h, fields)
        if not values:
            return None, self._nvlink_links.get(index)
        recovery = reads.recovery_action(values[0], r)
        if not known and len(values) > 1:
            links = reads.field_uint(values[1])
            if links is None:
                r.failures["nvlink"] = error_name(int(values[1].nvmlReturn))
            self._nvlink_links[index] = links or None
        return recovery, self._nvlink_links.get(index)

    # -- cheap polls -----------------------------------------------------------------------------------

    def _poll_handle(self, index: int, mig: str | None) -> Any:
        if mig:
            handle = self._mig_handles.get(mig)
            if handle is None:
                self._check_index(index)
                try:
                    handle = self._nv.nvmlDeviceGetHandleByUUID(mig)
                except self._nv.NVMLError as exc:
                    raise GpuQueryError(f"MIG device {mig}", error_name(error_code(exc))) from None
                self._mig_handles[mig] = handle
            return handle
        h = self._handles.get(index)
        return h if h is not None else self._handle(index)

    def memory_used(self, index: int, mig: str | None = None) -> int | None:
        """One NVML call (handle cached): used bytes, or None when it cannot be read (unknown)."""
        try:
            h = self._poll_handle(index, mig)
        except GpuQueryError:
            return None
        if h is None:
            return None
        return self._memory(h, Reader(self._nv))[1]

    def utilization(self, index: int) -> int | None:
        """One NVML call (handle cached): the GPU's utilisation in percent, or None when it cannot be read."""
        h = self._poll_handle(index, None)
        if h is None:
            return None
        try:
            return int(self._nv.nvmlDeviceGetUtilizationRates(h).gpu)
        except self._nv.NVMLError:  # not supported (MIG mode), lost, no permission: unknown
            return None

    def sensors(self, index: int) -> tuple[float | None, int | None]:
        """Two NVML calls (handle cached), for the metrics: power draw in watts and temperature in degrees C;
        None for what NVML cannot tell."""
        h = self._poll_handle(index, None)
        if h is None:
            return None, None
        r = Reader(self._nv)
        milliwatts = r.call("power", "nvmlDeviceGetPowerUsage", h)
        celsius = r.call("temperature", "nvmlDeviceGetTemperature", h, 0)  # NVML_TEMPERATURE_GPU
        return (None if milliwatts is None else milliwatts / 1000.0), (None if celsius is None else int(celsius))

    def processes(self, index: int, mig: str | None = None) -> tuple[GpuProcess, ...]:
        """Compute then graphics processes: one call each when the lists are empty. GpuQueryError when NVML
        cannot answer (no permission, not supported, GPU lost): unknown is not empty."""
        where = f"MIG device {mig}" if mig else f"GPU{index}"
        h = self._poll_handle(index, mig)
        r = Reader(self._nv)
        if h is None:
            raise GpuQueryError(f"{where} process list", r.failures.get("handle", "GPU_IS_LOST"))
        procs = reads.processes(h, r, mig)
        if procs is None:
            failed = r.failures.get("compute_processes") or r.failures.get("graphics_processes") or "error"
            raise GpuQueryError(f"{where} process list", failed)
        return procs

    def health(self, index: int) -> GpuHealth:
        """The run-time watch's poll: the recovery-action field and the uncorrected volatile ECC count (one NVML
        call each, handle cached); a GPU_IS_LOST from either is a lost GPU. A query the GPU cannot answer (not
        supported, no permission) is not asked again; when neither can be asked, memory info is the liveness
        probe. Never raises for NVML's answers."""
        r = Reader(self._nv)
        h = self._handles.get(index)
        if h is None:
            self._check_index(index)
            h = self._handle(index, r)
        if h is None:
            return GpuHealth(index=index, lost=r.lost, unknown=_health_unknown(r.failures))
        na = self._health_na.setdefault(index, {})
        recovery = None if "recovery_action" in na else self._recovery_field(h, r)
        ecc = None if "ecc" in na else r.call("ecc", "nvmlDeviceGetTotalEccErrors", h, 1, 0)  # uncorrected, volatile
        if recovery is None and ecc is None and not r.lost:
            self._memory(h, r)  # liveness only: a lost GPU answers GPU_IS_LOST
        na.update({label: name for label, name in r.failures.items() if name in _NA_NAMES and label != "memory"})
        unknown = _health_unknown({**na, **r.failures})
        return GpuHealth(index, lost=r.lost, ecc_uncorrected_volatile=ecc, recovery_action=recovery, unknown=unknown)

    def _recovery_field(self, h: Any, r: Reader) -> str | None:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION alone, in one nvmlDeviceGetFieldValues call."""
        field_id = getattr(self._nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
        values = r.call("recovery_action", "nvmlDeviceGetFieldValues", h, [field_id])
        return reads.recovery_action(values[0], r) if values else None

    # -- events ----------------------------------------------------------------------------------------

    def watch_xid(
        self, indices: list[int] | Sequence[int], timeout_s: float, stop: threading.Event | None = None
    ) -> list[XidEvent]:
        """Critical XID events on `indices` until `timeout_s` passes or `stop` is set (see nvml_events)."""
        return watch_xid(self._nv, self._handle, indices, timeout_s, stop)

    def open_xid_events(self, indices: Sequence[int]) -> XidSubscription | None:
        """One event set for critical Xid events on `indices`, kept open and polled without waiting."""
        return open_xid_subscription(self._nv, self._handle, indices)


_NA_NAMES = frozenset(error_name(code) for code in NOT_AVAILABLE_CODES)  # "NOT_SUPPORTED", ...


def _health_unknown(failures: dict[str, str]) -> tuple[str, ...]:
    """What a health poll could not read, as "label: NVML error name" (a lost GPU is `lost`, not unknown)."""
    return tuple(f"{label}: {name}" for label, name in failures.items() if name != "GPU_IS_LOST")

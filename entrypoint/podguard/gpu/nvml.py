"""`NvmlBackend`: the `GpuBackend` on the real NVML binding (`nvidia-ml-py`, imported as `pynvml`).

Why this shape:

* NVML only, in-process: no CUDA context, no torch. Importing this module is cheap; `pynvml` itself
  (~25 ms to import) is loaded only when a backend is constructed.
* nvitop-style degradation: every per-field query is wrapped. NOT_SUPPORTED, FUNCTION_NOT_FOUND (a symbol
  an older driver lacks), NOT_FOUND and NO_PERMISSION give `None` ("n/a"); GPU_IS_LOST marks the snapshot
  `lost=True` and the snapshot still returns what it could read; anything else is recorded in `errors` as
  a short string. A query never crashes the preflight.
* The polls used while waiting after a cleanup (`memory_used`, `processes`) make the fewest NVML calls
  the binding allows (one for memory; one per process list when empty) and reuse cached device handles.
* `watch_xid` uses an NVML event set and returns when its window ends, not before and not much later.

Library loading: pynvml opens `libnvidia-ml.so.1` by soname, which the dynamic loader resolves with
LD_LIBRARY_PATH as it was when the process started. An explicit library (argument `library_path`, or env
`PODGUARD_NVML_LIBRARY`) is loaded by path and handed to pynvml instead; the test suite uses this to load
its fake library in-process, and users can use it to pick a driver library explicitly.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from podguard.gpu.backend import (
    ComputeMode,
    DriverInfo,
    EccState,
    GpuProcess,
    GpuSnapshot,
    MigDevice,
    NvmlFailure,
    NvmlUnavailable,
    XidEvent,
    decode_clock_events,
)

if TYPE_CHECKING:
    import threading


def _debug(msg: str, *args: object) -> None:
    """Log at debug level; `logging` is imported only on these rare paths to keep the import cheap."""
    import logging

    logging.getLogger(__name__).debug(msg, *args)


ENV_LIBRARY = "PODGUARD_NVML_LIBRARY"

# NVML return codes (nvml.h `nvmlReturn_t`), spelled out so classification needs no pynvml import.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25

NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_ENABLE = 1
XID_WAIT_SLICE_S = 0.1  # the Protocol's promise: a set `stop` ends a watch within 100 ms

# Errors that mean "this GPU/driver cannot tell us": shown as n/a, not as a failure.
NOT_AVAILABLE_CODES = frozenset(
    {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_FOUND, NVML_ERROR_NO_PERMISSION}
)

_INIT_FAILURES: dict[int, NvmlFailure] = {
    NVML_ERROR_LIBRARY_NOT_FOUND: NvmlFailure.LIBRARY_NOT_FOUND,
    NVML_ERROR_DRIVER_NOT_LOADED: NvmlFailure.DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: NvmlFailure.VERSION_MISMATCH,
    NVML_ERROR_GPU_IS_LOST: NvmlFailure.GPU_LOST,
    NVML_ERROR_NO_PERMISSION: NvmlFailure.NO_PERMISSION,
    NVML_ERROR_INSUFFICIENT_RESOURCES: NvmlFailure.INSUFFICIENT_RESOURCES,
}

COMPUTE_MODES: dict[int, ComputeMode] = {
    0: ComputeMode.DEFAULT,
    1: ComputeMode.EXCLUSIVE_THREAD,
    2: ComputeMode.PROHIBITED,
    3: ComputeMode.EXCLUSIVE_PROCESS,
}

# nvmlDeviceGpuRecoveryAction_t
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "reset",
    2: "reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

# nvmlValueType_t -> the nvmlValue_t union member that holds it
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def classify_init_error(code: int | None) -> NvmlFailure:
    """Map nvmlInit's return code to the failure kind the user gets advice for."""
    if code is None:
        return NvmlFailure.UNKNOWN
    return _INIT_FAILURES.get(code, NvmlFailure.UNKNOWN)


def format_cuda_version(version: int | None) -> str | None:
    """NVML's 12040 -> "12.4" (the form `nvidia-smi` prints and CUDA wheels are tagged with)."""
    if version is None or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # NVMLError.__str__ calls back into the library
        text = ""
    code = _error_code(exc)
    if code is not None:
        return f"{text or 'NVML error'} ({code})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _address(handle: object) -> int | None:
    """The C pointer behind an nvmlDevice_t, to recognise the device an event came from."""
    import ctypes

    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


def _import_pynvml(library_path: str | None) -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # the dependency is declared; a broken install still gets a clear message
        raise NvmlUnavailable(NvmlFailure.LIBRARY_NOT_FOUND, f"the nvidia-ml-py binding is missing: {exc}") from None
    if library_path:
        _bind_library(pynvml, library_path)
    return pynvml


def _bind_library(nv: ModuleType, path: str) -> None:
    """Load the NVML library at `path` and make it pynvml's library (see the module docstring)."""
    import ctypes

    with nv.libLoadLock:
        current = nv.nvmlLib
        if current is not None:
            if os.path.realpath(str(getattr(current, "_name", ""))) == os.path.realpath(path):
                return
            if getattr(nv, "_nvmlLib_refcount", 0) > 0:
                raise NvmlUnavailable(
                    NvmlFailure.UNKNOWN,
                    f"another NVML library ({getattr(current, '_name', '?')}) is in use in this process",
                )
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NvmlUnavailable(NvmlFailure.LIBRARY_NOT_FOUND, f"{path}: {exc}") from None
        nv.nvmlLib = lib
        cache = getattr(nv, "_nvmlGetFunctionPointer_cache", None)
        if isinstance(cache, dict):
            cache.clear()  # function pointers of a previous library must not be reused


class _Reader:
    """Runs NVML queries for one snapshot, turning failures into n/a, `lost` or a short error string."""

    def __init__(self, nv: ModuleType) -> None:
        self.nv = nv
        self.lost = False
        self.errors: list[str] = []

    def call(self, label: str, name: str, *args: Any) -> Any:
        """pynvml.<name>(*args), or None when it is n/a, lost or failed (recorded)."""
        return self.first(label, (name, *args))

    def first(self, label: str, *attempts: tuple[Any, ...]) -> Any:
        """Try (name, *args) attempts in order, moving on only when a symbol is missing (old driver or old
        binding): e.g. the clock *event* reasons, then the older *throttle* reasons."""
        for name, *args in attempts:
            fn = getattr(self.nv, name, None)
            if fn is None:
                continue
            try:
                return fn(*args)
            except self.nv.NVMLError as exc:
                code = _error_code(exc)
                if code in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                    continue
                self.record(label, exc)
                return None
            except Exception as exc:  # a binding quirk must never crash the preflight
                if type(exc).__name__ == "NVMLLibraryMismatchError":
                    continue  # pynvml's wrapper for FunctionNotFound on unversioned calls
                self.record(label, exc)
                return None
        return None

    def record(self, label: str, exc: BaseException) -> None:
        code = _error_code(exc)
        if code in NOT_AVAILABLE_CODES:
            return
        if code == NVML_ERROR_GPU_IS_LOST:
            self.lost = True
            return
        self.errors.append(f"{label}: {_describe(exc)}")

    def code(self, label: str, code: int) -> None:
        """Account for a per-field return code (nvmlFieldValue_t.nvmlReturn)."""
        if code == NVML_SUCCESS or code in NOT_AVAILABLE_CODES:
            return
        if code == NVML_ERROR_GPU_IS_LOST:
            self.lost = True
            return
        self.errors.append(f"{label}: NVML error {code}")


class NvmlBackend:
    """`GpuBackend` over NVML. Construction initialises NVML or raises `NvmlUnavailable`."""

    def __init__(self, library_path: str | os.PathLike[str] | None = None) -> None:
        self._closed = True
        path = os.fspath(library_path) if library_path else os.environ.get(ENV_LIBRARY) or None
        self._nv = _import_pynvml(path)
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            code = _error_code(exc)
            raise NvmlUnavailable(classify_init_error(code), _describe(exc)) from None
        except OSError as exc:  # defensive: a loader error surfacing from ctypes
            raise NvmlUnavailable(NvmlFailure.LIBRARY_NOT_FOUND, str(exc)) from None
        self._closed = False
        self._handles: dict[int, Any] = {}
        self._count: int | None = None
        self._memory_v1 = False  # the driver lacks nvmlDeviceGetMemoryInfo_v2: use v1 from then on

    # -- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut NVML down once (pynvml reference-counts init/shutdown)."""
        if self._closed:
            return
        self._closed = True
        self._handles.clear()
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
        r = _Reader(self._nv)
        cuda = r.first(
            "cuda_driver_version", ("nvmlSystemGetCudaDriverVersion_v2",), ("nvmlSystemGetCudaDriverVersion",)
        )
        return DriverInfo(
            driver_version=_text(r.call("driver_version", "nvmlSystemGetDriverVersion")),
            cuda_driver_version=format_cuda_version(cuda),
            nvml_version=_text(r.call("nvml_version", "nvmlSystemGetNVMLVersion")),
        )

    def device_count(self) -> int:
        """Number of GPUs NVML sees. Raises NvmlUnavailable if NVML cannot even count (never a silent 0:
        that would look like a CPU-only node)."""
        if self._count is None:
            try:
                self._count = int(self._nv.nvmlDeviceGetCount())
            except self._nv.NVMLError as exc:
                raise NvmlUnavailable(classify_init_error(_error_code(exc)), _describe(exc)) from None
        return self._count

    # -- per GPU ---------------------------------------------------------------------------------------

    def _check_index(self, index: int) -> None:
        count = self.device_count()
        if not 0 <= index < count:
            valid = f"0..{count - 1}" if count else "none (no GPU)"
            raise IndexError(f"GPU index {index} out of range (valid: {valid})")

    def _handle(self, index: int, reader: _Reader | None = None) -> Any:
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
        r = _Reader(nv)
        h = self._handle(index, r)
        if h is None:
            return GpuSnapshot(index=index, lost=r.lost, errors=tuple(r.errors))
        pci = r.call("pci", "nvmlDeviceGetPciInfo_v3", h)
        memory = self._memory(h, r)
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
        return GpuSnapshot(
            index=index,
            name=_text(r.call("name", "nvmlDeviceGetName", h)),
            uuid=_text(r.call("uuid", "nvmlDeviceGetUUID", h)),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            minor_number=r.call("minor_number", "nvmlDeviceGetMinorNumber", h),
            memory_total=memory[0],
            memory_used=memory[1],
            memory_reserved=memory[2],
            memory_free=memory[3],
            utilization_gpu=util.gpu if util is not None else None,
            utilization_memory=util.memory if util is not None else None,
            processes=self._processes(h, r),
            compute_mode=COMPUTE_MODES.get(mode) if mode is not None else None,
            persistence_mode=None if persistence is None else persistence == NVML_FEATURE_ENABLED,
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(h, r) if mig_enabled else (),
            ecc=self._ecc(h, r),
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
            recovery_action=self._recovery_action(h, r),
            lost=r.lost,
            errors=tuple(r.errors),
        )

    def _memory(self, h: Any, r: _Reader) -> tuple[int | None, int | None, int | None, int | None]:
        """(total, used, reserved, free). v2 separates the driver's reserved memory; v1 (old drivers)
        folds it into `used`, so `reserved` is n/a there."""
        nv = self._nv
        if not self._memory_v1:
            version = getattr(nv, "nvmlMemory_v2", None)
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                return m.total, m.used, m.reserved, m.free
            except nv.NVMLError as exc:
                if _error_code(exc) not in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                    r.record("memory", exc)
                    return None, None, None, None
                self._memory_v1 = True
            except TypeError:  # a binding without the `version` argument
                self._memory_v1 = True
        m = r.call("memory", "nvmlDeviceGetMemoryInfo", h)
        if m is None:
            return None, None, None, None
        return m.total, m.used, None, m.free

    def _process_list(self, h: Any, r: _Reader, kind: str) -> list[GpuProcess]:
        base = "nvmlDeviceGetComputeRunningProcesses" if kind == "compute" else "nvmlDeviceGetGraphicsRunningProcesses"
        infos = r.first(f"{kind}_processes", (f"{base}_v3", h), (f"{base}_v2", h))
        if not infos:
            return []
        out = []
        for info in infos:
            used = info.usedGpuMemory
            out.append(GpuProcess(pid=int(info.pid), used_memory=int(used) if used is not None else None, kind=kind))
        return out

    def _processes(self, h: Any, r: _Reader) -> tuple[GpuProcess, ...]:
        return tuple(self._process_list(h, r, "compute") + self._process_list(h, r, "graphics"))

    def _mig_devices(self, h: Any, r: _Reader) -> tuple[MigDevice, ...]:
        slots = r.call("mig_devices", "nvmlDeviceGetMaxMigDeviceCount", h) or 0
        devices = []
        for slot in range(slots):
            mh = r.call("mig_device", "nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
            if mh is None:
                continue  # NOT_FOUND: an empty slot
            uuid = _text(r.call("mig_uuid", "nvmlDeviceGetUUID", mh))
            if not uuid:
                continue
            devices.append(
                MigDevice(
                    uuid=uuid,
                    gpu_instance_id=r.call("mig_gpu_instance", "nvmlDeviceGetGpuInstanceId", mh),
                    compute_instance_id=r.call("mig_compute_instance", "nvmlDeviceGetComputeInstanceId", mh),
                )
            )
        return tuple(devices)

    def _ecc(self, h: Any, r: _Reader) -> EccState:
        mode = r.call("ecc_mode", "nvmlDeviceGetEccMode", h)
        enabled = None if mode is None else mode[0] == NVML_FEATURE_ENABLED
        counts: dict[str, int | None] = {}
        if enabled is not False:  # with ECC off the driver has no counters
            for key, error_type, counter in (
                ("uncorrected_volatile", 1, 0),  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
                ("corrected_volatile", 0, 0),
                ("uncorrected_aggregate", 1, 1),  # NVML_AGGREGATE_ECC
                ("corrected_aggregate", 0, 1),
            ):
                counts[key] = r.call(f"ecc_{key}", "nvmlDeviceGetTotalEccErrors", h, error_type, counter)
        retired = r.call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
        remap = r.call("remapped_rows", "nvmlDeviceGetRemappedRows", h)
        return EccState(
            enabled=enabled,
            uncorrected_volatile=counts.get("uncorrected_volatile"),
            corrected_volatile=counts.get("corrected_volatile"),
            uncorrected_aggregate=counts.get("uncorrected_aggregate"),
            corrected_aggregate=counts.get("corrected_aggregate"),
            retired_pages_pending=None if retired is None else retired == NVML_FEATURE_ENABLED,
            remap_pending=None if remap is None else bool(remap[2]),
            remap_failure=None if remap is None else bool(remap[3]),
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
        )

    def _recovery_action(self, h: Any, r: _Reader) -> str | None:
        field_id = getattr(self._nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
        values = r.call("recovery_action", "nvmlDeviceGetFieldValues", h, [field_id])
        if not values:
            return None
        value = values[0]
        if value.nvmlReturn != NVML_SUCCESS:
            r.code("recovery_action", int(value.nvmlReturn))
            return None
        member = _VALUE_MEMBERS.get(int(value.valueType))
        if member is None:
            return None
        action = int(getattr(value.value, member))
        return RECOVERY_ACTIONS.get(action, f"unknown_{action}")

    # -- cheap polls -----------------------------------------------------------------------------------

    def memory_used(self, index: int) -> int | None:
        """One NVML call (handle cached): used bytes, or None when it cannot be read."""
        h = self._handles.get(index)
        if h is None:
            h = self._handle(index)
            if h is None:
                return None
        return self._memory(h, _Reader(self._nv))[1]

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """Compute then graphics processes: one call each when the lists are empty."""
        h = self._handles.get(index)
        if h is None:
            h = self._handle(index)
            if h is None:
                return ()
        return self._processes(h, _Reader(self._nv))

    # -- events ----------------------------------------------------------------------------------------

    def watch_xid(
        self, indices: list[int] | Sequence[int], timeout_s: float, stop: threading.Event | None = None
    ) -> list[XidEvent]:
        """Critical XID events on `indices` until `timeout_s` passes or `stop` is set.

        Returns when the window ends, not before (so callers can use it as the gate's observation window),
        also when events are unsupported ([]). Waits in slices of at most 100 ms so `stop` is prompt."""
        nv = self._nv
        deadline = time.monotonic() + max(0.0, timeout_s)
        events: list[XidEvent] = []
        event_set = None
        try:
            try:
                event_set = nv.nvmlEventSetCreate()
            except nv.NVMLError as exc:
                _debug("NVML events unavailable: %s", _describe(exc))
            watched: dict[int, int] = {}
            if event_set is not None:
                for index in indices:
                    h = self._handle(index)
                    if h is None:
                        continue
                    try:
                        nv.nvmlDeviceRegisterEvents(h, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
                    except nv.NVMLError as exc:
                        _debug("GPU %s: XID events unavailable: %s", index, _describe(exc))
                        continue
                    address = _address(h)
                    if address is not None:
                        watched[address] = index
            if not watched:
                _wait_until(deadline, stop)
                return events
            wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
            while not (stop is not None and stop.is_set()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                slice_ms = max(1, math.ceil(min(remaining, XID_WAIT_SLICE_S) * 1000))
                try:
                    data = wait(event_set, slice_ms)
                except nv.NVMLError as exc:
                    if _error_code(exc) == NVML_ERROR_TIMEOUT:
                        continue
                    _debug("NVML event wait failed: %s", _describe(exc))
                    _wait_until(deadline, stop)
                    break
                if not data.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                    continue
                index = watched.get(_address(data.device) or -1)
                if index is None:
                    continue
                events.append(XidEvent(gpu_index=index, xid=int(data.eventData), timestamp=time.time()))
        finally:
            if event_set is not None:
                with contextlib.suppress(Exception):
                    nv.nvmlEventSetFree(event_set)
        return events


def _wait_until(deadline: float, stop: threading.Event | None) -> None:
    """Wait out the window: until `deadline`, or until `stop` is set."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return
    if stop is not None:
        stop.wait(remaining)
    else:
        time.sleep(remaining)

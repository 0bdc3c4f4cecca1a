"""What the NVML backend needs around the binding: return codes and their names, the library binding, and
the per-query reader that turns failures into n/a, `lost`, unknown or a short error.

    r = Reader(pynvml)
    r.call("memory", "nvmlDeviceGetMemoryInfo", handle)   # None on failure; r.failures["memory"] says why
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

from podguard.gpu.backend import ComputeMode, GpuProcess, NvmlFailure, NvmlUnavailable

if TYPE_CHECKING:
    import threading

__all__ = [
    "COMPUTE_MODES",
    "ENV_LIBRARY",
    "NOT_AVAILABLE_CODES",
    "Reader",
    "classify_init_error",
    "error_name",
    "format_cuda_version",
    "unknown_fields",
]


def debug(msg: str, *args: object) -> None:
    """Log at debug level (the rare paths: an NVML call that failed in an unexpected way)."""
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
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_GET_STATE = 165  # scopeId = the link; newer drivers (older ones: per-link nvmlDeviceGetNvLinkState)
NVLINK_UP_STATES = frozenset({1, 2})  # NVML_NVLINK_STATE_ACTIVE, _SLEEP (a low-power link is not a broken one)
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_ENABLE = 1
XID_WAIT_SLICE_S = 0.1  # the Protocol's promise: a set `stop` ends a watch within 100 ms

# Errors that mean "this GPU/driver cannot tell us": shown as n/a, not as a failure.
NOT_AVAILABLE_CODES = frozenset(
    {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_FOUND, NVML_ERROR_NO_PERMISSION}
)

INIT_FAILURES: dict[int, NvmlFailure] = {
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
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


ERROR_NAMES = {
    NVML_ERROR_NOT_SUPPORTED: "NOT_SUPPORTED",
    NVML_ERROR_NO_PERMISSION: "NO_PERMISSION",
    NVML_ERROR_NOT_FOUND: "NOT_FOUND",
    NVML_ERROR_TIMEOUT: "TIMEOUT",
    NVML_ERROR_FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    NVML_ERROR_GPU_IS_LOST: "GPU_IS_LOST",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "INSUFFICIENT_RESOURCES",
}


def error_name(code: int | None) -> str:
    """NVML's name for a return code ("NO_PERMISSION"), or "error <code>"."""
    if code is None:
        return "error"
    return ERROR_NAMES.get(code, f"error {code}")


def classify_init_error(code: int | None) -> NvmlFailure:
    """Map nvmlInit's return code to the failure kind the user gets advice for."""
    if code is None:
        return NvmlFailure.UNKNOWN
    return INIT_FAILURES.get(code, NvmlFailure.UNKNOWN)


def format_cuda_version(version: int | None) -> str | None:
    """NVML's 12040 -> "12.4" (the form `nvidia-smi` prints and CUDA wheels are tagged with)."""
    if version is None or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def text_of(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe_error(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # NVMLError.__str__ calls back into the library
        text = ""
    code = error_code(exc)
    if code is not None:
        return f"{text or 'NVML error'} ({code})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def address_of(handle: object) -> int | None:
    """The C pointer behind an nvmlDevice_t, to recognise the device an event came from."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


def import_pynvml(library_path: str | None) -> ModuleType:
    try:
        import pynvml  # noqa: PLC0415  lazy: pynvml (the NVML binding): a broken install is a clean CPU-node error, not an import failure
    except ImportError as exc:  # the dependency is declared; a broken install still gets a clear message
        raise NvmlUnavailable(NvmlFailure.LIBRARY_NOT_FOUND, f"the nvidia-ml-py binding is missing: {exc}") from None
    if library_path:
        bind_library(pynvml, library_path)
    return pynvml


def bind_library(nv: ModuleType, path: str) -> None:
    """Load the NVML library at `path` and make it pynvml's library (see the module docstring)."""
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


class Reader:
    """Runs NVML queries for one snapshot, turning failures into n/a, `lost` or a short error string."""

    def __init__(self, nv: ModuleType) -> None:
        self.nv = nv
        self.lost = False
        self.errors: list[str] = []
        self.failures: dict[str, str] = {}  # label -> NVML error name, for every query that did not answer

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
                code = error_code(exc)
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
        self._account(label, error_code(exc), describe_error(exc))

    def code(self, label: str, code: int) -> None:
        """Account for a per-field return code (nvmlFieldValue_t.nvmlReturn)."""
        if code != NVML_SUCCESS:
            self._account(label, code, f"NVML error {code}")

    def _account(self, label: str, code: int | None, detail: str) -> None:
        """A failed query: "not available" is just noted, a lost GPU marks the snapshot, anything else is an error."""
        self.failures[label] = error_name(code)
        if code in NOT_AVAILABLE_CODES:
            return
        if code == NVML_ERROR_GPU_IS_LOST:
            self.lost = True
            return
        self.errors.append(f"{label}: {detail}")


def unknown_fields(r: Reader, memory_used: int | None, processes: tuple[GpuProcess, ...] | None) -> tuple[str, ...]:
    """What a snapshot could not tell about occupancy: memory use and the process list."""
    out = []
    if memory_used is None:
        out.append(f"memory: {r.failures.get('memory', 'not reported')}")
    if processes is None:
        failed = r.failures.get("compute_processes") or r.failures.get("graphics_processes") or "not reported"
        out.append(f"processes: {failed}")
    return tuple(out)


def wait_until(deadline: float, stop: threading.Event | None) -> None:
    """Wait out the window: until `deadline`, or until `stop` is set."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return
    if stop is not None:
        stop.wait(remaining)
    else:
        time.sleep(remaining)

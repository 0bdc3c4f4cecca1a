"""GPU faults during the run: what NVML says about the selected GPUs while the job runs, in podguard's process.

    watch = open_gpu_fault_watch([(0, "GPU-..."), (1, "GPU-...")])   # None on a CPU-only node / without NVML
    # every watch.POLL_INTERVAL_S, from the supervisor's loop:
    for fault in watch.poll():         # new faults only; never blocks, never raises
        print(fault.text)              # "GPU 3 (GPU-...): Xid 79: GPU has fallen off the bus"
        if fault.fatal: ...            # end the job, exit 76
    watch.close()

What is watched (NVML only, no CUDA context; docs/watch.md, "GPU faults"), per poll:
- critical Xid events, from one NVML event set kept open for the run and drained with a 0 ms wait: fatal per
  FATAL_XIDS, application-level per APPLICATION_XIDS (printed, never acted on), any other reported, not fatal;
- a GPU lost (NVML answers GPU_IS_LOST): fatal, named as lost, with the Xid that came on that GPU, if one did;
- the uncorrected volatile ECC count rising above its value when the watch opened: fatal;
- the driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) changing from its value at open to one that
  is not "none": fatal.
Each fault is reported once. An NVML answer other than GPU_IS_LOST is "unknown" (`unknown`), never a fault.
docs/watch.md ("GPU faults") gives each fatal Xid's source.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from podguard.gpu.backend import GpuBackend, GpuHealth, NvmlUnavailable, XidEvent, XidSubscription
from podguard.gpu.nvml import NvmlBackend
from podguard.gpu.nvml_support import error_code, error_name
from podguard.gpu.xids import APPLICATION_XIDS as _APPLICATION
from podguard.gpu.xids import RUN_FATAL_XIDS, XID_MEANINGS, xid_meaning

__all__ = [
    "APPLICATION_XIDS",
    "FATAL_XIDS",
    "POLL_INTERVAL_S",
    "GpuFault",
    "GpuFaultWatch",
    "open_gpu_fault_watch",
]

log = logging.getLogger("podguard.watch")

# How often the supervisor's loop polls. A lost GPU mostly makes the other ranks hang, so 1 s latency is what
# "ends the job within seconds" needs; Xid events queue in the event set between polls (none is missed). A poll
# on 8 GPUs costs ~1 ms of Python + NVML, so 1 s keeps it near 0.1 % of a core (bench/bench_gpu_watch.py).
POLL_INTERVAL_S = 1.0

# NVIDIA's Xid catalogue (gpu/xids.py): the Xids that end the job (docs/watch.md), the application-level ones (the job's
# own fault on a healthy GPU: printed naming the GPU, never acted on), and the others the text names.
FATAL_XIDS: dict[int, str] = {xid: XID_MEANINGS[xid] for xid in sorted(RUN_FATAL_XIDS)}
APPLICATION_XIDS: dict[int, str] = {xid: XID_MEANINGS[xid] for xid in sorted(_APPLICATION)}
OTHER_XIDS: dict[int, str] = {
    x: m for x, m in XID_MEANINGS.items() if x not in FATAL_XIDS and x not in APPLICATION_XIDS
}

# The driver's recovery actions (nvmlDeviceGpuRecoveryAction_t), as the backend names them, for a person.
RECOVERY_MEANINGS: dict[str, str] = {
    "reset": "a GPU reset",
    "reboot": "a node reboot",
    "drain_p2p": "draining peer-to-peer traffic",
    "drain_and_reset": "draining the GPU, then a reset",
    "recover_imex_domain": "recovering the IMEX domain",
    "bus_reset": "a PCIe bus reset",
    "system_reboot": "a system reboot",
}

XID, LOST, ECC, RECOVERY = "xid", "lost", "ecc_uncorrected", "recovery_action"


@dataclass(frozen=True)
class GpuFault:
    """One fault on one GPU, as the watch saw it."""

    index: int  # NVML index
    uuid: str | None
    kind: str  # "xid" | "lost" | "ecc_uncorrected" | "recovery_action"
    xid: int | None  # the Xid where one came (a lost GPU with an Xid 79 names both)
    fatal: bool
    text: str  # one line a person reads: "GPU 3 (GPU-...): Xid 79: GPU has fallen off the bus"
    at: float  # time.monotonic()
    wall: float = 0.0  # time.time(), for the record

    @property
    def application(self) -> bool:
        """An application-level Xid (the job's own fault): printed, never acted on."""
        return self.kind == XID and self.xid in APPLICATION_XIDS

    def to_dict(self) -> dict[str, Any]:
        """For the JSON record: the GPU (index and UUID), the Xid, what happened and when."""
        return {
            "gpu": self.index,
            "uuid": self.uuid,
            "kind": self.kind,
            "xid": self.xid,
            "fatal": self.fatal,
            "application": self.application,
            "text": self.text,
            "time": round(self.wall, 3),
        }


class GpuFaultWatch:
    """See the module docstring. `gpus`: the selected GPUs as (NVML index, UUID); `owns_backend`: close it too."""

    POLL_INTERVAL_S: float = POLL_INTERVAL_S

    def __init__(self, backend: GpuBackend, gpus: Sequence[tuple[int, str | None]], *, owns_backend: bool = False):
        self._backend = backend
        self._owns_backend = owns_backend
        self.gpus: dict[int, str | None] = {}
        for index, uuid in gpus:  # several MIG slices of one GPU: one entry
            self.gpus[index] = self.gpus.get(index) or uuid
        self.unknown: dict[str, str] = {}  # what NVML could not tell ("GPU 2 ecc" -> "NOT_SUPPORTED")
        self.faults: list[GpuFault] = []  # every fault reported, in order
        self._reported: set[tuple[int, str, object]] = set()
        self._xids: dict[int, int] = {}  # GPU -> the Xid a lost GPU is named with (its newest; a fatal one first)
        self._lost: set[int] = set()  # reported lost: no longer queried
        self._lost_at_open: set[int] = set()  # lost before the first poll: reported by it
        self._new: list[GpuFault] = []  # the faults of the poll under way
        self._stamp = (0.0, 0.0)  # its (monotonic, wall) time
        self._ecc_base: dict[int, int] = {}
        self._recovery_base: dict[int, str] = {}
        self._events = self._open_events()
        for index in self.gpus:
            self._baseline(index)

    # -- opening -----------------------------------------------------------------------------------------

    def _open_events(self) -> XidSubscription | None:
        try:
            events = self._backend.open_xid_events(list(self.gpus))
        except Exception as exc:  # never raise: no events is "unknown"
            self.unknown["xid events"] = _why(exc)
            return None
        if events is None:
            self.unknown["xid events"] = "not available"
            return None
        for index, why in events.unwatched.items():
            self.unknown[f"GPU {index} xid events"] = why
        return events

    def _baseline(self, index: int) -> None:
        """The ECC count and recovery action at open: later polls report a change from these."""
        health = self._health(index)
        if health is None:
            return
        if health.ecc_uncorrected_volatile is not None:
            self._ecc_base[index] = health.ecc_uncorrected_volatile
        if health.recovery_action is not None:
            self._recovery_base[index] = health.recovery_action
        if health.lost:
            self._lost_at_open.add(index)

    # -- polling -----------------------------------------------------------------------------------------

    def poll(self) -> list[GpuFault]:
        """The faults that are new since the last poll. Never blocks (the event wait has a 0 ms timeout) and
        never raises: an NVML error is recorded in `unknown`, except GPU_IS_LOST, which is a lost GPU."""
        self._stamp, self._new = (time.monotonic(), time.time()), []
        try:
            self._poll()
        except Exception as exc:  # a bug here must not take the supervisor's loop down
            log.debug("GPU fault watch: poll failed: %s", exc, exc_info=True)
            self.unknown["watch"] = _why(exc)
        new, self._new = self._new, []
        self.faults.extend(new)
        return new

    def _poll(self) -> None:
        for event in self._drain():  # events first: a GPU found lost in this poll is named with its Xid
            self._on_xid(event)
        for index in self.gpus:
            if index in self._lost:
                continue
            if index in self._lost_at_open:
                self._on_lost(index)
                continue
            health = self._health(index)
            if health is not None:
                self._on_health(health)

    def _drain(self) -> list[XidEvent]:
        if self._events is None:
            return []
        try:
            events = self._events.poll()
        except Exception as exc:
            self.unknown["xid events"] = _why(exc)
            return []
        if self._events.failure:
            self.unknown["xid events"] = self._events.failure
        return events

    def _health(self, index: int) -> GpuHealth | None:
        try:
            health = self._backend.health(index)
        except Exception as exc:
            self.unknown[f"GPU {index}"] = _why(exc)
            return None
        for item in health.unknown:
            label, _, why = item.partition(": ")
            self.unknown[f"GPU {index} {label}"] = why or item
        return health

    def _on_xid(self, event: XidEvent) -> None:
        index, xid = event.gpu_index, event.xid
        if index not in self.gpus:
            return
        fatal = xid in FATAL_XIDS
        if fatal or index not in self._xids or self._xids[index] not in FATAL_XIDS:
            self._xids[index] = xid
        text = f"Xid {xid}: {xid_meaning(xid)}"
        if xid in APPLICATION_XIDS:
            text += " (application-level: the job's own error, not acted on)"
        elif not fatal:
            text += " (not one podguard ends the job for)"
        self._report(index, XID, xid, fatal, text, xid=xid)

    def _on_health(self, health: GpuHealth) -> None:
        index = health.index
        if health.lost:
            self._on_lost(index)
            return
        ecc = health.ecc_uncorrected_volatile
        if ecc is not None:
            base = self._ecc_base.setdefault(index, ecc)  # unknown at open: the first count read is the base
            if ecc > base:
                text = f"{ecc - base} new uncorrected ECC error(s) (volatile count {base} -> {ecc})"
                self._report(index, ECC, None, True, text)
        action = health.recovery_action
        if action is not None and action not in ("none", self._recovery_base.setdefault(index, action)):
            meaning = RECOVERY_MEANINGS.get(action, action)
            text = f"the driver asks for {meaning} (recovery action {action})"
            self._report(index, RECOVERY, action, True, text)

    def _on_lost(self, index: int) -> None:
        self._lost.add(index)
        xid = self._xids.get(index)
        text = "lost: NVML answers GPU_IS_LOST"
        if xid is not None:
            text += f" (after Xid {xid}: {xid_meaning(xid)})"
        self._report(index, LOST, None, True, text, xid=xid)

    def _report(self, index: int, kind: str, detail: object, fatal: bool, text: str, xid: int | None = None) -> None:
        """Add a fault to this poll's unless this one (GPU, kind, detail) was reported already."""
        key = (index, kind, detail)
        if key in self._reported:
            return
        self._reported.add(key)
        uuid = self.gpus.get(index)
        line = f"GPU {index} ({uuid}): {text}" if uuid else f"GPU {index}: {text}"
        self._new.append(GpuFault(index, uuid, kind, xid, fatal, line, *self._stamp))

    # -- for the supervisor --------------------------------------------------------------------------------

    @property
    def backend(self) -> GpuBackend:
        """The NVML session the watch polls (the metrics' GPU gauges are read through it: one NVML reader)."""
        return self._backend

    def fatal_on(self, index: int) -> GpuFault | None:
        """The first fatal fault seen on this GPU: a worker on it that dies later has this as its root cause."""
        return next((f for f in self.faults if f.index == index and f.fatal), None)

    def to_dict(self) -> dict[str, Any]:
        """For the run's record: what was watched, what could not be, and the faults."""
        return {
            "gpus": [{"gpu": i, "uuid": u} for i, u in self.gpus.items()],
            "xid_events": self._events is not None,
            "poll_interval_s": self.POLL_INTERVAL_S,
            "unknown": dict(self.unknown),
            "faults": [f.to_dict() for f in self.faults],
        }

    def close(self) -> None:
        """Free the event set (and the backend, when the watch opened it). Safe to call twice."""
        events, self._events = self._events, None
        if events is not None:
            _quietly(events.close)
        if self._owns_backend:
            self._owns_backend = False
            _quietly(self._backend.close)


def open_gpu_fault_watch(
    gpus: Sequence[tuple[int, str | None]], *, library_path: str | os.PathLike[str] | None = None
) -> GpuFaultWatch | None:
    """A watch on its own NVML backend, or None (never an exception) when there is nothing to watch: no GPU
    selected, a CPU-only node, or NVML that cannot start (the reason is logged at debug level)."""
    if not gpus:
        return None
    try:
        backend = NvmlBackend(library_path=library_path)
    except NvmlUnavailable as exc:
        log.debug("GPU fault watch off: %s", exc.message)
        return None
    except Exception as exc:
        log.debug("GPU fault watch off: %s", _why(exc))
        return None
    try:
        return GpuFaultWatch(backend, gpus, owns_backend=True)
    except Exception as exc:  # defensive: the watch's own code never raises by design
        log.debug("GPU fault watch off: %s", _why(exc))
        _quietly(backend.close)
        return None


def _why(exc: BaseException) -> str:
    """A short reason for `unknown`: NVML's error name where there is one."""
    code = error_code(exc)
    return error_name(code) if code is not None else f"{type(exc).__name__}: {exc}"


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception as exc:
        log.debug("GPU fault watch: close failed: %s", _why(exc))

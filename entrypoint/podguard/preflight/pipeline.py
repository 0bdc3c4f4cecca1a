"""The preflight: cleanup -> detect -> select -> gate, with a JSON report and a short human summary.

`train`, `run`, `health` and `cleanup` all go through `run_preflight`. It never imports torch (the CUDA
probe runs in a child process) and never sleeps for a fixed time: every wait polls a condition with a
deadline.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from podguard.errors import ExitCode, PodguardError
from podguard.gpu.backend import GpuBackend, GpuSnapshot, NvmlUnavailable, XidEvent
from podguard.gpu.factory import open_backend
from podguard.preflight.gate.rules import (
    GateResult,
    GateThresholds,
    GpuVerdict,
    ProbeEvidence,
    Verdict,
    busy_reasons,
    judge_all,
)
from podguard.preflight.options import PreflightOptions, validate_options
from podguard.preflight.selection import Selection, select_gpus
from podguard.report import Timings, format_summary, write_report
from podguard.state import state_dir

if TYPE_CHECKING:  # imported where used: `gpus`, `health` and CPU-only nodes never need them
    from podguard.preflight.leases import GpuLease


@dataclass(frozen=True)
class PreflightResult:
    exit_code: int  # 0, 64, 69, 75, 76
    selection: Selection | None
    report_path: Path | None
    summary: str  # the short human summary that was printed
    message: str = ""  # one-line reason when exit_code != 0
    lease: GpuLease | None = None  # held GPU leases (train/run); the caller releases them when the job ends


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------

COMMANDS_WITH_CLEANUP = ("train", "run", "cleanup", "preflight")


def select_for(opts: PreflightOptions, inventory: list[GpuSnapshot]) -> Selection:
    """The selection these options ask for on this inventory (UsageError 64 / PodguardError 69)."""
    return select_gpus(
        inventory,
        gpu_list=opts.gpu_list,
        cuda_visible_devices=opts.cuda_visible_devices,
        nproc_per_node=opts.nproc_per_node,
        expect_gpus=opts.expect_gpus,
        on_fewer=opts.on_fewer,
        require_gpu=opts.require_gpu,
    )


def _recommendations(exit_code: int, gate: GateResult | None, nvml_failure: str | None) -> list[str]:
    recs: list[str] = []
    if nvml_failure:
        recs.append("stop and start the pod (a container restart keeps the same driver state), or move machines")
    if exit_code == ExitCode.GPUS_BUSY:
        recs.append("retry later, or run `podguard cleanup` / `podguard doctor` to see who holds the GPUs")
        if gate and any("phantom" in r for v in gate.verdicts for r in v.reasons):
            recs.append("phantom memory persists across container restarts: stop and start the pod")
    if exit_code == ExitCode.GPU_UNHEALTHY and gate is not None:
        bad = [str(v.index) for v in gate.verdicts if v.verdict is Verdict.UNHEALTHY]
        recs.append(
            f"GPU(s) {','.join(bad)} failed the health check: exclude them with GPU_LIST, or stop and start the pod "
            "(`podguard pod heal`), or move to another machine"
        )
    return recs


def run_preflight(
    opts: PreflightOptions,
    *,
    backend_factory: Callable[[], GpuBackend | None] | None = None,
    out: TextIO | None = None,
    quiet: bool = False,
    validate_selection: Callable[[Selection], None] | None = None,
) -> PreflightResult:
    """Run the preflight and return its verdict. Never raises for expected failures: they become exit codes.

    Order: validate everything -> open NVML -> inventory -> select -> cleanup + wait (train/run/cleanup)
    -> NVML checks -> probe children in parallel while XID events are watched -> report.
    `validate_selection` lets the caller reject its own configuration against the selection (a roles
    file asking for more GPUs than selected, say) before anything is leased or killed.
    """
    out = out if out is not None else sys.stderr
    imports_started = time.perf_counter()
    if backend_factory is None:
        # Loading code is interpreter start-up, not preflight work: timed apart from it.
        import pynvml  # noqa: F401
    if opts.cleanup and opts.command in COMMANDS_WITH_CLEANUP:
        import podguard.preflight.cleanup.executor
    if opts.lease:
        import podguard.preflight.leases  # noqa: F401
    imports_ms = round((time.perf_counter() - imports_started) * 1000, 3)
    timings = Timings()
    payload: dict[str, Any] = {
        "command": opts.command,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pid": os.getpid(),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "warnings": [],
    }
    selection: Selection | None = None
    gate: GateResult | None = None
    backend: GpuBackend | None = None
    nvml_failure: str | None = None
    lease: GpuLease | None = None
    exit_code: int = ExitCode.OK
    message = ""
    try:
        state = state_dir(opts.state_dir)
    except PodguardError as exc:
        _emit(out, quiet, f"podguard: error: {exc.message}")
        return PreflightResult(exc.code, None, None, exc.message, exc.message)
    try:
        validate_options(opts)
        t = time.perf_counter()
        try:
            backend = (backend_factory or open_backend)()
        except NvmlUnavailable as exc:
            nvml_failure = exc.kind.value
            payload["nvml"] = {"available": False, "failure": exc.kind.value, "detail": exc.detail}
            raise PodguardError(f"NVML: {exc.message}", ExitCode.GPU_UNHEALTHY) from None
        t = timings.mark("nvml_init", t)
        inventory: list[GpuSnapshot] = []
        if backend is not None:
            payload["driver"] = asdict(backend.driver())
            inventory = [backend.snapshot(i) for i in range(backend.device_count())]
        else:
            payload["nvml"] = {"available": False, "failure": "library_not_found"}
        t = timings.mark("inventory", t)
        selection = select_for(opts, inventory)
        payload["warnings"].extend(selection.warnings)
        if validate_selection is not None:
            validate_selection(selection)
        t = timings.mark("select", t)
        if opts.lease and selection.gpus:
            lease = _lease(opts, selection, inventory, out, quiet)
            if tuple(lease.gpus) != selection.gpus:
                payload["warnings"].append(
                    f"GPU(s) {','.join(str(i) for i in selection.indices)} partly leased by other runs: using "
                    f"{','.join(str(i) for i in lease.indices)}"
                )
                selection = replace(selection, gpus=tuple(lease.gpus))
            t = timings.mark("lease", t)
        elif opts.command == "cleanup" and selection.gpus:
            selection, skipped = _skip_leased(selection, opts)
            payload["warnings"].extend(skipped)
        indices = sorted(set(selection.indices))
        if backend is not None and indices and opts.cleanup and opts.command in COMMANDS_WITH_CLEANUP:
            from podguard.preflight.cleanup.executor import execute_cleanup, plan_cleanup

            plan = plan_cleanup(
                backend,
                indices,
                dev_dir=opts.dev_dir,
                protect=opts.protect,
                patterns=opts.kill_patterns,
                snapshots={s.index: s for s in inventory},
            )
            progress = None if quiet else (lambda text: _emit(out, False, f"podguard: {text}"))
            result = execute_cleanup(
                plan,
                backend,
                grace_s=opts.grace_s,
                busy_timeout_s=opts.busy_timeout_s,
                idle_memory_mib=opts.idle_memory_mib,
                dry_run=opts.dry_run,
                progress=progress,
            )
            payload["cleanup"] = result.to_dict()
            t = timings.mark("cleanup", t)
        elif backend is not None and indices and opts.command in ("train", "run"):
            # --no-cleanup: kill nothing, but still give busy GPUs until --busy-timeout to come free
            from podguard.preflight.cleanup.executor import wait_for_idle

            wait_for_idle(
                backend,
                indices,
                deadline=time.monotonic() + opts.busy_timeout_s,
                idle_memory_mib=opts.idle_memory_mib,
                dev_dir=opts.dev_dir,
            )
            t = timings.mark("wait_idle", t)
        if opts.command == "cleanup":
            gate = _judge(backend, indices, opts, probes={}, xids=[], hardware=False)
        elif backend is not None and indices:
            gate = _gate(backend, selection, indices, opts, timings)
        else:
            gate = GateResult(())
        t = timings.mark("gate", t)
        payload["gate"] = {"verdicts": [v.to_dict() for v in gate.verdicts], "xids": [asdict(x) for x in gate.xids]}
        exit_code = gate.exit_code
        if exit_code == ExitCode.GPUS_BUSY:
            busy = [str(v.index) for v in gate.verdicts if v.verdict is Verdict.BUSY]
            message = f"GPU(s) {','.join(busy)} still busy after waiting {opts.busy_timeout_s:g}s"
        elif exit_code == ExitCode.GPU_UNHEALTHY:
            bad = [str(v.index) for v in gate.verdicts if v.verdict is Verdict.UNHEALTHY]
            message = f"GPU(s) {','.join(bad)} failed the health check"
    except PodguardError as exc:
        exit_code, message = exc.code, exc.message
    finally:
        if backend is not None:
            backend.close()
        if lease is not None and exit_code != ExitCode.OK:
            lease.release()
            lease = None

    verdict = (
        "pass"
        if exit_code == 0
        else {64: "bad-input", 69: "missing", 75: "busy", 76: "unhealthy"}.get(exit_code, "fail")
    )
    payload.update(
        verdict=verdict,
        exit_code=exit_code,
        message=message,
        selection=selection.to_dict() if selection else None,
        recommendations=_recommendations(exit_code, gate, nvml_failure),
    )
    payload["timings_ms"] = {**timings.phases, "total": timings.total_ms(), "imports_not_in_total": imports_ms}
    report_path: Path | None = None
    try:
        report_path = write_report(state, opts.command, payload)
        payload["report_path"] = str(report_path)
    except OSError as exc:
        payload["warnings"].append(f"could not write the report: {exc}")
    if exit_code == ExitCode.USAGE:
        # bad input: one line naming the bad value; nothing was done, so no summary to read
        summary = f"podguard: error: {message}"
    else:
        summary = format_summary(payload)
    _emit(out, quiet, summary)
    return PreflightResult(exit_code, selection, report_path, summary, message, lease)


def _lease(
    opts: PreflightOptions, selection: Selection, inventory: list[GpuSnapshot], out: TextIO, quiet: bool
) -> GpuLease:
    """Lease the selected GPUs so a concurrent run neither lands on them nor "cleans up" our workers.

    An explicit list (GPU_LIST / CUDA_VISIBLE_DEVICES) must be leased exactly (refused, exit 75, or
    waited for with --wait-for-gpus); otherwise any free GPUs of the node will do, as many as selected.
    """
    from podguard.preflight.leases import acquire_gpus

    explicit = selection.source in ("GPU_LIST", "CUDA_VISIBLE_DEVICES")
    candidates = selection.gpus if explicit else select_gpus(inventory).gpus
    progress = None if quiet else (lambda text: _emit(out, False, f"podguard: {text}"))
    return acquire_gpus(
        candidates,
        None if explicit else len(selection.gpus),
        explicit=explicit,
        wait=opts.wait_for_gpus,
        timeout_s=opts.busy_timeout_s,
        progress=progress,
        lease_dir=opts.lease_dir,
        command=opts.extra.get("command_line"),
    )


def _skip_leased(selection: Selection, opts: PreflightOptions) -> tuple[Selection, list[str]]:
    """`podguard cleanup` never touches GPUs that a live podguard run holds a lease on: those are its job."""
    from podguard.preflight.leases import current_gpu_leases, gpu_lease_key

    held = current_gpu_leases(opts.lease_dir)
    if not held:
        return selection, []
    keep, notes = [], []
    for gpu in selection.gpus:
        key = gpu_lease_key(gpu)
        if key not in held:
            keep.append(gpu)
            continue
        holder = held[key]
        notes.append(f"GPU {gpu.index} skipped: leased by {holder.describe() if holder else 'another podguard run'}")
    return replace(selection, gpus=tuple(keep)), notes


def _gate(
    backend: GpuBackend, selection: Selection, indices: list[int], opts: PreflightOptions, timings: Timings
) -> GateResult:
    """NVML checks first; then the probe on GPUs that passed them, with XID events watched meanwhile."""
    nvml_only = _judge(backend, indices, opts, probes={}, xids=[], hardware=True)
    candidates = [v.index for v in nvml_only.verdicts if v.verdict is Verdict.HEALTHY]
    probe_mode = opts.probe
    if probe_mode == "auto":
        from podguard.preflight.gate.probe import cuda_probe_available

        probe_mode = "cuda" if (opts.probe_cmd or cuda_probe_available()) else "off"
    if probe_mode == "off" and opts.probe_cmd is None:
        if opts.xid_window_s > 0 and candidates:
            xids = backend.watch_xid(candidates, opts.xid_window_s)
            return _judge(backend, indices, opts, probes={}, xids=xids, hardware=True)
        return nvml_only
    if not candidates:
        return nvml_only
    t = time.perf_counter()
    targets = []
    for gpu in selection.gpus:
        if gpu.index in candidates and gpu.index not in {i for i, _ in targets}:
            targets.append((gpu.index, gpu.visible_id))
    from podguard.preflight.gate.probe import run_probes

    watcher = XidWatcher(backend, candidates, opts.probe_timeout_s + 1.0)
    results = run_probes(targets, timeout_s=opts.probe_timeout_s, probe_cmd=opts.probe_cmd)
    xids = watcher.stop()
    timings.mark("probe", t)
    probes = {r.index: ProbeEvidence(r.ok, r.reason, r.duration_ms, busy=r.busy) for r in results}
    return _judge(backend, indices, opts, probes=probes, xids=xids, hardware=True)


def _judge(
    backend: GpuBackend | None,
    indices: list[int],
    opts: PreflightOptions,
    *,
    probes: dict[int, ProbeEvidence],
    xids: list[XidEvent],
    hardware: bool,
) -> GateResult:
    if backend is None:
        return GateResult(())
    thresholds = GateThresholds(opts.idle_memory_mib, opts.max_temperature_margin_c, opts.fail_on_warnings)
    snaps = [backend.snapshot(i) for i in indices]
    if not hardware:
        # `podguard cleanup` answers one question: is the GPU free now?
        verdicts = []
        for snap in snaps:
            busy = busy_reasons(snap, opts.idle_memory_mib)
            verdicts.append(GpuVerdict(snap.index, snap.uuid, Verdict.BUSY if busy else Verdict.HEALTHY, tuple(busy)))
        return GateResult(tuple(verdicts))
    return judge_all(snaps, thresholds, probes=probes, xids=xids)


class XidWatcher:
    """Collects XID events in a background thread while the probe children run.

    NVML's event wait blocks; the `stop` event lets the backend end the wait within its poll slice as soon
    as the probes are done, so the gate window costs no more than the probes themselves.
    """

    def __init__(self, backend: GpuBackend, indices: list[int], timeout_s: float) -> None:
        self._events: list[XidEvent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(backend, indices, timeout_s), daemon=True)
        self._thread.start()

    def _run(self, backend: GpuBackend, indices: list[int], timeout_s: float) -> None:
        try:
            self._events.extend(backend.watch_xid(indices, timeout_s, stop=self._stop))
        except Exception as exc:  # a watcher failure must never fail the gate by itself
            logging.getLogger("podguard.preflight.pipeline").debug("XID watch failed: %s", exc)

    def stop(self) -> list[XidEvent]:
        self._stop.set()
        self._thread.join(timeout=0.5)
        return list(self._events)


def _emit(out: TextIO, quiet: bool, text: str) -> None:
    if not quiet and text:
        print(text, file=out, flush=True)

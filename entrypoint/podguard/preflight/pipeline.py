"""The preflight of `train`, `run`, `health` and `cleanup`: a few named stages, a JSON report, a short summary.

    result = run_preflight(PreflightOptions(command="health", probe=ProbeMode.OFF))
    result.exit_code   # 0 / 64 / 69 / 75 / 76 (podguard.errors.ExitCode)

Stages: open the backend -> inventory + selection -> lease (train/run) -> cleanup or wait -> gate ->
verdict -> report. Never imports torch (the CUDA probe runs in a child) and never sleeps a fixed time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError
from podguard.gpu.backend import GpuBackend, GpuSnapshot, NvmlUnavailable
from podguard.gpu.factory import open_backend
from podguard.gpu.selected import Selection
from podguard.preflight.advice import recommendations
from podguard.preflight.cleanup.executor import execute_cleanup, plan_cleanup, wait_for_idle
from podguard.preflight.cleanup.vocabulary import CleanupResult, GpuIdleState
from podguard.preflight.exclusion import exclude_degraded
from podguard.preflight.gate import stage
from podguard.preflight.gate.rules import GateResult, Verdict
from podguard.preflight.jobs import leased_elsewhere
from podguard.preflight.lease_files import default_lease_dir
from podguard.preflight.leases import GpuLease, acquire_gpus
from podguard.preflight.options import PreflightOptions, validate_options
from podguard.preflight.report import Timings, format_summary, redact_data, verdict_word, write_report
from podguard.preflight.selection import mig_scope, select_for, select_gpus
from podguard.records import to_data
from podguard.state import state_dir

__all__ = ["COMMANDS_WITH_CLEANUP", "PreflightResult", "run_preflight", "select_for"]

COMMANDS_WITH_CLEANUP = ("train", "run", "cleanup", "preflight")


@dataclass(frozen=True)
class PreflightResult:
    exit_code: int  # ExitCode: 0, 64, 69, 75, 76
    selection: Selection | None
    report_path: Path | None
    summary: str  # the short human summary that was printed
    message: str = ""  # one-line reason when exit_code != 0
    lease: GpuLease | None = None  # held GPU leases (train/run); the caller releases them when the job ends
    reasons: tuple[str, ...] = ()  # when it failed: "UNHEALTHY GPU 0: ...", or "FAIL: <message>" (cluster gate)


def run_preflight(
    opts: PreflightOptions,
    *,
    backend_factory: Callable[[], GpuBackend | None] | None = None,
    validate_selection: Callable[[Selection], None] | None = None,
    held: GpuLease | None = None,
    faulted: Mapping[str, tuple[str, str]] | None = None,
) -> PreflightResult:
    """Run the preflight and return its verdict. Never raises for expected failures: they become exit codes.

    `validate_selection` lets the caller reject its own configuration against the selection (a roles
    file asking for more GPUs than selected, say) before anything is leased or killed. `held`: the GPUs a
    restarted job already leases (`--restarts`): they are kept, not leased again, and never released here.
    `faulted`: GPUs with a fatal fault during an earlier attempt (gate/stage.py `follow_faults`): unhealthy.
    """
    pre = Preflight(opts, backend_factory, validate_selection, held)
    pre.faulted = dict(faulted or {})
    return pre.run()


class Preflight:
    """One preflight; the stages share their results through these fields."""

    def __init__(
        self,
        opts: PreflightOptions,
        backend_factory: Callable[[], GpuBackend | None] | None,
        validate_selection: Callable[[Selection], None] | None,
        held: GpuLease | None = None,
    ) -> None:
        self.opts = opts
        self.held = held
        self.faulted: dict[str, tuple[str, str]] = {}  # GPUs that faulted during an earlier attempt
        self.backend_factory = backend_factory
        self.validate_selection = validate_selection
        self.imports_ms = self._import_what_is_needed()
        self.timings = Timings()
        self.payload: dict[str, Any] = {
            "command": opts.command,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "pid": os.getpid(),
            "options": to_data(opts),
            "warnings": [],
        }
        self.backend: GpuBackend | None = None
        self.inventory: list[GpuSnapshot] = []
        self.selection: Selection | None = None
        self.lease: GpuLease | None = None
        self.lease_dir: Path | None = None
        self.leased_by_others: dict[int, str] = {}  # pid -> who: other live podguard runs on this host
        self.in_use: dict[int, str] = {}  # GPU -> the live run leasing it (health: its own job is on it)
        self.idle_states: dict[int, GpuIdleState] = {}  # what the cleanup or the wait left behind
        self.cleanup: CleanupResult | None = None
        self.waited_s: float | None = None  # how long a wait for busy GPUs actually ran (None: no wait)
        self.gate: GateResult | None = None
        self.nvml_failure: str | None = None
        self.exit_code: int = ExitCode.OK
        self.message = ""

    def _import_what_is_needed(self) -> float:
        """Load the code this command needs up front: interpreter start-up, timed apart from the work."""
        started = time.perf_counter()
        if self.backend_factory is None:
            import pynvml  # noqa: F401, PLC0415  lazy: the NVML binding, loaded here so that its cost is timed apart

        return round((time.perf_counter() - started) * 1000, 3)

    @property
    def _looks_up_leases(self) -> bool:
        """Whether this command needs other runs' leases: to lease, to never touch their jobs, to skip their
        GPUs (cleanup) or to find them in use by their own job (health)."""
        opts = self.opts
        stops = opts.cleanup and opts.command in COMMANDS_WITH_CLEANUP
        return opts.lease or stops or opts.command in ("cleanup", "health")

    @property
    def indices(self) -> list[int]:
        return sorted(set(self.selection.indices)) if self.selection and self.backend else []

    # -- the run -------------------------------------------------------------------------------------

    def run(self) -> PreflightResult:
        try:
            state = state_dir(self.opts.state_dir)
        except PodguardError as exc:
            console.error(exc.message)
            return PreflightResult(exc.code, None, None, exc.message, exc.message)
        try:
            self.open_backend()
            self.inventory_and_select()
            self.lease_or_look_up_leases()
            self.cleanup_or_wait()
            self.judge()
        except PodguardError as exc:
            self.exit_code, self.message = exc.code, exc.message
        finally:
            if self.backend is not None:
                self.backend.close()
            if self.lease is not None and self.exit_code != ExitCode.OK:
                if self.lease is not self.held:  # a restarted job's lease stays with the job
                    self.lease.release()
                self.lease = None
        return self.report(state)

    def open_backend(self) -> None:
        validate_options(self.opts)
        t = time.perf_counter()
        try:
            self.backend = (self.backend_factory or open_backend)()
        except NvmlUnavailable as exc:
            self.nvml_failure = exc.kind.value
            self.payload["nvml"] = {"available": False, "failure": exc.kind.value, "detail": exc.detail}
            raise PodguardError(f"NVML: {exc.message}", ExitCode.GPU_UNHEALTHY) from None
        self.timings.mark("nvml_init", t)

    def inventory_and_select(self) -> None:
        t = time.perf_counter()
        if self.backend is not None:
            self.payload["driver"] = to_data(self.backend.driver())
            self.inventory = [self.backend.snapshot(i) for i in range(self.backend.device_count())]
        else:
            self.payload["nvml"] = {"available": False, "failure": "library_not_found"}
        t = self.timings.mark("inventory", t)
        self.selection = select_for(self.opts, self.inventory)
        self.payload["warnings"].extend(self.selection.warnings)
        if self.validate_selection is not None:
            self.validate_selection(self.selection)
        self.timings.mark("select", t)

    def lease_or_look_up_leases(self) -> None:
        """train/run lease their GPUs; every command that may stop processes or judge busy GPUs learns which
        other live podguard runs hold leases here (their jobs are never touched, nor called "busy")."""
        assert self.selection is not None
        opts = self.opts
        if not self.selection.gpus or self.backend is None:
            return
        t = time.perf_counter()
        if opts.lease:
            self.lease = self._lease()
            if tuple(self.lease.gpus) != self.selection.gpus:
                self.payload["warnings"].append(
                    f"GPU(s) {','.join(map(str, self.selection.indices))} partly leased by other runs: using "
                    f"{','.join(map(str, self.lease.indices))}"
                )
                self.selection = replace(self.selection, gpus=tuple(self.lease.gpus))
        if self._looks_up_leases:
            own = self.lease.paths if self.lease is not None else ()
            found = leased_elsewhere(self.selection, self._lease_dir(), own=own)
            self.leased_by_others = found.pids
            if opts.command == "cleanup" and found.gpus:
                self.selection = replace(
                    self.selection, gpus=tuple(g for g in self.selection.gpus if g not in found.gpus)
                )
                self.payload["warnings"].extend(found.notes)
            elif opts.command == "health":
                self.in_use = found.in_use
        self.timings.mark("lease", t)

    def _lease_dir(self) -> Path:
        """The lease dir, resolved once per preflight (finding the default probes the volume for flock)."""
        if self.lease_dir is None:
            self.lease_dir = self.opts.lease_dir if self.opts.lease_dir is not None else default_lease_dir()
        return self.lease_dir

    def _lease(self) -> GpuLease:
        """Lease the selected GPUs so a concurrent run neither lands on them nor "cleans up" our workers.
        An explicit list must be leased exactly (refused, exit 75, or waited for with --wait-for-gpus);
        otherwise any free GPUs of the node will do, as many as selected."""
        assert self.selection is not None
        if self.held is not None:
            return self.held
        explicit = self.selection.source in ("GPU_LIST", "CUDA_VISIBLE_DEVICES")
        candidates = self.selection.gpus if explicit else select_gpus(self.inventory).gpus
        return acquire_gpus(
            candidates,
            None if explicit else len(self.selection.gpus),
            explicit=explicit,
            wait=self.opts.wait_for_gpus,
            timeout_s=self.opts.busy_timeout_s,
            lease_dir=self._lease_dir(),
            command=self.opts.extra.get("command_line"),
        )

    def cleanup_or_wait(self) -> None:
        """train/run/cleanup stop leftover holders and wait for memory; with --no-cleanup, train/run still
        give busy GPUs until --busy-timeout to come free. health and dry runs wait for nothing."""
        opts, backend, indices = self.opts, self.backend, self.indices
        if backend is None or not indices:
            return
        t = time.perf_counter()
        assert self.selection is not None
        if opts.cleanup and opts.command in COMMANDS_WITH_CLEANUP:
            plan = plan_cleanup(
                backend,
                indices,
                dev_dir=opts.dev_dir,
                protect=opts.protect,
                patterns=opts.kill_patterns,
                snapshots={s.index: s for s in self.inventory},
                mig=self.selection.mig_devices,
                leased=self.leased_by_others,
            )
            self.cleanup = execute_cleanup(
                plan,
                backend,
                grace_s=opts.grace_s,
                busy_timeout_s=opts.busy_timeout_s,
                idle_memory_mib=opts.idle_memory_mib,
                dry_run=opts.dry_run,
            )
            self.payload["cleanup"] = self.cleanup.to_dict()
            self.idle_states = dict(self.cleanup.states)
            if not opts.dry_run:
                self.waited_s = self.cleanup.timings_ms.get("wait_idle", 0.0) / 1000.0
            self.timings.mark("cleanup", t)
        elif opts.command in ("train", "run"):
            self.idle_states = wait_for_idle(
                backend,
                indices,
                deadline=time.monotonic() + opts.busy_timeout_s,
                idle_memory_mib=opts.idle_memory_mib,
                dev_dir=opts.dev_dir,
                mig=mig_scope({s.index: s for s in self.inventory}, self.selection.mig_devices),
            )
            self.waited_s = time.perf_counter() - t
            self.payload["wait"] = {str(i): s.to_dict() for i, s in self.idle_states.items()}
            self.timings.mark("wait_idle", t)

    def judge(self) -> None:
        t = time.perf_counter()
        backend, indices, selection = self.backend, self.indices, self.selection
        if backend is None or not indices or selection is None:
            gate = GateResult(())
        else:
            mig = mig_scope({s.index: s for s in self.inventory}, selection.mig_devices)
            if self.opts.command == "cleanup":
                gate = stage.gate_free_now(backend, indices, self.opts, mig)
            else:
                targets = [(g.index, g.visible_id) for g in selection.gpus]
                gate = stage.gate_hardware(
                    backend, targets, self.opts, mig=mig, in_use=self.in_use, mark=self.timings.mark
                )
            gate = stage.follow_cleanup(gate, self.idle_states)
            gate = stage.follow_faults(gate, self.faulted)
        self.gate = gate
        self.timings.mark("gate", t)
        self.payload["gate"] = gate.to_dict()
        self.payload["gpus"] = self._gpu_records(gate)
        self.exit_code = gate.exit_code
        self.message = self._message(gate)
        if gate.excluded and self.exit_code == ExitCode.OK:
            self._exclude(gate)

    def _gpu_records(self, gate: GateResult) -> list[dict[str, Any]]:
        """`gpus[]` of the report: each judged GPU's verdict, probe metrics and degraded findings, as data."""
        names = {s.index: s.name for s in self.inventory}
        return [
            {
                "index": v.index,
                "uuid": v.uuid,
                "name": names.get(v.index),
                "verdict": v.verdict.value,
                "metrics": dict(v.probe.metrics) if v.probe is not None else {},
                "degraded": [d.to_dict() for d in v.degraded],
            }
            for v in gate.verdicts
        ]

    def _exclude(self, gate: GateResult) -> None:
        """--degraded exclude: run on the rest when it still meets what the job needs (preflight/exclusion.py)."""
        assert self.selection is not None
        outcome = exclude_degraded(
            self.selection, gate.excluded, nproc_per_node=self.opts.nproc_per_node, on_fewer=self.opts.on_fewer
        )
        if outcome.selection is None:
            self.exit_code = ExitCode.GPUS_MISSING
            self.message = outcome.message
            return
        self.payload["warnings"].extend(outcome.warnings)
        self.selection = outcome.selection

    # -- verdict and report --------------------------------------------------------------------------

    def _message(self, gate: GateResult) -> str:
        """One line saying what actually happened (no wait -> no "after waiting")."""
        if gate.exit_code == ExitCode.GPU_UNHEALTHY:
            return f"GPU(s) {_ids(gate.indices(Verdict.UNHEALTHY))} failed the health check"
        parts = []
        busy, unknown = gate.indices(Verdict.BUSY), gate.indices(Verdict.UNKNOWN)
        if busy:
            waited = self.waited_s
            after = f" after waiting {_seconds(waited)}" if waited is not None and waited >= 0.05 else ""
            parts.append(f"GPU(s) {_ids(busy)} {'still busy' if after else 'busy'}{after}")
        if unknown:
            parts.append(f"cannot tell whether GPU(s) {_ids(unknown)} are free (NVML could not answer)")
        for r in self.cleanup.respawners if self.cleanup else ():
            if not r.stopped:
                parts.append(f"pid {r.pid} ({r.cmdline[:60]}) keeps starting processes that hold the GPU")
        return "; ".join(parts)

    def report(self, state: Path) -> PreflightResult:
        self.payload.update(
            verdict=verdict_word(self.exit_code).lower(),
            exit_code=int(self.exit_code),
            message=self.message,
            selection=self.selection.to_dict() if self.selection else None,
            recommendations=recommendations(self.exit_code, self.gate, self.nvml_failure, self.cleanup),
        )
        self.payload["timings_ms"] = {
            **self.timings.phases,
            "total": self.timings.total_ms(),
            "imports_not_in_total": self.imports_ms,
        }
        report_path = write_report(state, self.opts.command, self.payload)  # best effort: None + one warning
        if report_path is not None:
            self.payload["report_path"] = str(report_path)
        if self.exit_code == ExitCode.USAGE:
            summary = f"podguard: error: {self.message}"  # bad input: one line naming it; nothing was done
        else:
            summary = format_summary(self.payload)
        console.line(summary, loud=self.exit_code != ExitCode.OK)  # the verdict: always shown, as it is
        return PreflightResult(
            self.exit_code, self.selection, report_path, summary, self.message, self.lease, self._reasons()
        )

    def _reasons(self) -> tuple[str, ...]:
        """The failure as lines another node can print after `node N: ` (the cluster gate publishes them)."""
        if self.exit_code == ExitCode.OK:
            return ()
        word = verdict_word(self.exit_code)
        lines = [
            f"{gpu['verdict'].upper().replace('_', ' ')} GPU {gpu['index']}: {'; '.join(gpu['reasons'])}"
            for gpu in self.payload.get("gate", {}).get("verdicts", [])
            if gpu["verdict"] not in (Verdict.HEALTHY, Verdict.IN_USE)
        ]
        return tuple(redact_data(lines or [f"{word}: {self.message or 'the preflight failed'}"]))


def _ids(indices: list[int]) -> str:
    return ",".join(map(str, indices))


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 10 else f"{value:.0f}s"

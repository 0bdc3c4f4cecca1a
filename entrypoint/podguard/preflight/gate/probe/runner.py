"""Run the per-GPU health probe in child processes, all GPUs at once, each with a hard timeout.

    results = run_probes([(0, "GPU-..."), (1, "GPU-...")], timeout_s=60)   # or probe_cmd="my-check"
    [r.ok for r in results]

Each child sees only its GPU, runs in its own process group (killed whole on timeout) and dies with
podguard (a death-signal exec wrapper, no `preexec_fn`). Why children, why one per GPU: docs/gate.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podguard.errors import UsageError
from podguard.preflight.gate.probe.deathsig import dying_with
from podguard.records import Record

__all__ = [
    "DEFAULT_PROBE_MODULE",
    "METRIC_KEYS",
    "ProbeResult",
    "cuda_probe_available",
    "cuda_probe_status",
    "metrics_of",
    "run_probes",
]

DEFAULT_PROBE_MODULE = "podguard.preflight.gate.probe.cuda_child"
# What a probe may measure (docs/formats.md, "A probe's JSON line"): keys of its last JSON line, numbers >= 0.
METRIC_KEYS = ("matmul_tflops", "mem_gbps", "h2d_gbps", "allreduce_busbw_gbps")
TAIL_CHARS = 2000
_BUSY_RE = re.compile(r"busy or unavailable|out of memory", re.IGNORECASE)


@dataclass(frozen=True)
class ProbeResult(Record):
    index: int  # NVML index of the GPU
    ok: bool
    reason: str  # "" when ok; otherwise one line a person can read
    duration_ms: float
    output_tail: str = ""  # last lines the probe printed (stdout and stderr)
    visible_id: str = ""  # what CUDA_VISIBLE_DEVICES was for this probe (a UUID, normally)
    exit_code: int | None = None  # the probe's exit status; 128+N when killed by signal N; None if timed out
    timed_out: bool = False
    busy: bool = False  # the failure says "in use" (busy / out of memory), not "broken": cleanup may help
    device_name: str = ""  # reported by the default CUDA probe
    metrics: dict[str, float] = field(default_factory=dict)  # METRIC_KEYS found in its last JSON line


def cuda_probe_status(dev_dir: str | os.PathLike[str] | None = None) -> tuple[bool, str]:
    """(available, why) for the default CUDA probe, decided WITHOUT importing torch here.

    Needs: torch importable (find_spec only), a CUDA build of torch (read from torch/version.py, text
    only), and an NVIDIA driver present (/proc/driver/nvidia/version, or nvidiactl in the device dir).
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return False, "torch is not installed in this Python environment"
    torch_dir = Path(next(iter(spec.submodule_search_locations)))
    if not _torch_has_cuda(torch_dir):
        return False, f"torch at {torch_dir} is a CPU-only build"
    devices = Path(dev_dir or os.environ.get("PODGUARD_DEV_DIR") or "/dev")
    if not (Path("/proc/driver/nvidia/version").exists() or (devices / "nvidiactl").exists()):
        return False, "no NVIDIA driver (no /proc/driver/nvidia/version and no nvidiactl device)"
    return True, f"torch with CUDA at {torch_dir} and an NVIDIA driver"


def cuda_probe_available(dev_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether `PODGUARD_PROBE=auto` should run the CUDA probe on this node. Never imports torch."""
    return cuda_probe_status(dev_dir)[0]


def run_probes(
    gpus: Sequence[tuple[int, str]],
    *,
    timeout_s: float,
    probe_cmd: str | Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    on_started: Callable[[], object] | None = None,
) -> list[ProbeResult]:
    """Probe every GPU in `gpus` ((NVML index, CUDA_VISIBLE_DEVICES id) pairs) in parallel child processes.

    probe_cmd: the user's own probe (PODGUARD_PROBE_CMD; a string is shell-split), exit 0 = healthy;
    None runs the built-in CUDA probe. Each child sees only its GPU (CUDA_VISIBLE_DEVICES=<id>,
    CUDA_DEVICE_ORDER=PCI_BUS_ID) and PODGUARD_PROBE_GPU_INDEX=<NVML index>. Results come back in the
    order of `gpus`. A bad probe command is a UsageError (64) before anything starts. `on_started` is
    called once every child exists (the preflight starts its XID watcher thread there: after the forks).
    """
    if not timeout_s > 0:
        raise UsageError(f"probe timeout {timeout_s!r} is not valid; it must be > 0 seconds")
    argv = _probe_argv(probe_cmd)
    builtin = probe_cmd is None
    seen: set[int] = set()
    for index, _visible in gpus:
        if index in seen:
            raise UsageError(f"GPU {index} is listed twice for probing")
        seen.add(index)
    base_env = dict(os.environ)
    base_env.update(env or {})
    base_env["PYTHONUNBUFFERED"] = "1"

    running: list[_Running] = []
    try:
        for index, visible in gpus:
            child_env = dict(base_env)
            child_env.update(
                {
                    "CUDA_VISIBLE_DEVICES": str(visible),
                    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                    "PODGUARD_PROBE_GPU_INDEX": str(index),
                }
            )
            running.append(_Running.start(index, str(visible), argv, child_env))
        if on_started is not None:
            on_started()
        _pump(running, time.monotonic() + timeout_s)
    finally:
        for item in running:  # timeouts, and anything left after an exception (Ctrl-C) in here
            item.kill_group()
    return [item.result(builtin, timeout_s) for item in running]


# ----------------------------------------------------------------------------------------------------


class _Running:
    """One probe child: its process, its output (kept as a bounded tail), its timing."""

    def __init__(self, index: int, visible: str, proc: subprocess.Popen[bytes], started: float) -> None:
        self.index = index
        self.visible = visible
        self.proc = proc
        self.started = started
        self.ended: float | None = None
        self.returncode: int | None = None
        self.timed_out = False
        self.eof = False
        self.buf = bytearray()

    @classmethod
    def start(cls, index: int, visible: str, argv: list[str], env: dict[str, str]) -> _Running:
        started = time.monotonic()
        proc = subprocess.Popen(
            dying_with(os.getpid(), argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the timeout kills the whole tree
        )
        os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
        return cls(index, visible, proc, started)

    def feed(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > 4 * TAIL_CHARS:
            del self.buf[: len(self.buf) - 2 * TAIL_CHARS]

    def kill_group(self) -> None:
        """SIGKILL the probe's process group: the probe if still running, and anything it left behind."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.returncode is None:
            self.returncode = self.proc.wait()
            self.ended = self.ended or time.monotonic()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def result(self, builtin: bool, timeout_s: float) -> ProbeResult:
        ended = self.ended or time.monotonic()
        duration_ms = round((ended - self.started) * 1000, 1)
        tail = self.buf.decode("utf-8", "replace")[-TAIL_CHARS:]
        last = _last_json(tail)
        metrics = metrics_of(last)
        report = last if builtin else None  # a user's probe: exit 0 = healthy, its JSON line only measures
        name = str(report.get("device") or "") if report else ""
        if self.timed_out:
            return ProbeResult(
                index=self.index,
                ok=False,
                reason=f"probe timed out after {timeout_s:g}s",
                duration_ms=duration_ms,
                output_tail=tail,
                visible_id=self.visible,
                timed_out=True,
                device_name=name,
                metrics=metrics,
            )
        code = self.returncode if self.returncode is not None else -signal.SIGKILL
        exit_code = 128 - code if code < 0 else code
        ok = code == 0 and (report is None or bool(report.get("ok")))
        if ok:
            return ProbeResult(
                self.index, True, "", duration_ms, tail, self.visible, exit_code, False, False, name, metrics
            )
        if report and report.get("error"):
            reason = f"CUDA probe failed: {report['error']}"
        else:
            how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
            last = _last_line(tail)
            reason = f"probe {how}" + (f": {last}" if last else "")
        busy = bool(_BUSY_RE.search(reason))
        return ProbeResult(
            self.index, False, reason, duration_ms, tail, self.visible, exit_code, False, busy, name, metrics
        )


def _pump(running: list[_Running], deadline: float) -> None:
    """Read every probe's output as it comes (a chatty probe must not block on a full pipe) and note
    exits, until all are done or the deadline passes; the ones still running are marked timed out."""
    sel = selectors.DefaultSelector()
    for item in running:
        sel.register(item.proc.stdout, selectors.EVENT_READ, item)  # type: ignore[arg-type]
    pending = set(range(len(running)))
    try:
        while pending:
            now = time.monotonic()
            if now >= deadline:
                for i in pending:
                    running[i].timed_out = True
                    running[i].ended = now
                return
            # Short select timeout: also notices exits of probes whose pipe a grandchild keeps open.
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                item: _Running = key.data
                try:
                    chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                if chunk:
                    item.feed(chunk)
                else:
                    item.eof = True
                    sel.unregister(key.fileobj)
            for i in list(pending):
                item = running[i]
                code = item.proc.poll()
                if code is not None and item.returncode is None:
                    item.returncode = code
                    item.ended = time.monotonic()
                if item.returncode is not None and (item.eof or time.monotonic() - (item.ended or 0) > 0.2):
                    pending.discard(i)
    finally:
        sel.close()


def _probe_argv(probe_cmd: str | Sequence[str] | None) -> list[str]:
    if probe_cmd is None:
        return [sys.executable, "-m", DEFAULT_PROBE_MODULE]
    if isinstance(probe_cmd, str):
        try:
            argv = shlex.split(probe_cmd)
        except ValueError as exc:
            raise UsageError(f"PODGUARD_PROBE_CMD={probe_cmd!r} cannot be parsed: {exc}") from None
    else:
        argv = [str(a) for a in probe_cmd]
    if not argv:
        raise UsageError("PODGUARD_PROBE_CMD is empty; give a program to run per GPU (exit 0 = healthy)")
    program = argv[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UsageError(f"PODGUARD_PROBE_CMD program {program!r} does not exist or is not executable")
    elif shutil.which(program) is None:
        raise UsageError(f"PODGUARD_PROBE_CMD program {program!r} is not on PATH")
    return argv


def _torch_has_cuda(torch_dir: Path) -> bool:
    """CUDA build of torch? Read torch/version.py's `cuda = '12.4'` (vs `None`) as text; fall back to
    looking for libc10_cuda.so. Importing torch to ask would cost seconds and could touch the driver."""
    try:
        text = (torch_dir / "version.py").read_text()
    except OSError:
        text = ""
    match = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE)
    if match:
        return match.group(1).strip() not in ("None", "")
    return (torch_dir / "lib" / "libc10_cuda.so").exists()


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return None


def metrics_of(report: Mapping[str, Any] | None) -> dict[str, float]:
    """The METRIC_KEYS of a probe's JSON object (top level, or under "metrics") that are finite numbers >= 0;
    anything else (text, booleans, NaN, negatives) is left out rather than trusted."""
    if not report:
        return {}
    nested = report.get("metrics")
    merged = {**report, **nested} if isinstance(nested, Mapping) else dict(report)
    out: dict[str, float] = {}
    for key in METRIC_KEYS:
        value = merged.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
            out[key] = round(float(value), 3)
    return out


def _last_line(text: str) -> str:
    for line in reversed(text.replace("\r", "\n").splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""

"""The node's interconnect, measured (`PODGUARD_PROBE=full`): one all-reduce across the selected GPUs.

    result = run_allreduce([(0, "GPU-a..."), (1, "GPU-b...")], timeout_s=30)
    result.busbw_gbps        # bus bandwidth, GB/s, as nccl-tests computes it

One child process per GPU (torch.distributed, probe/allreduce_child.py), every child seeing all the selected
GPUs (so NCCL can use NVLink and P2P between them) and using the one at its rank. Each child runs in its own
process group and dies with podguard (the death-signal exec wrapper of deathsig.py, as the per-GPU probes
do); on timeout, or as soon as one rank fails (its peers would wait for it until the timeout), every group
is SIGKILLed. Importing this module never imports torch. Why and how the numbers are computed: docs/gate.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from podguard.errors import UsageError
from podguard.preflight.gate.probe.deathsig import dying_with
from podguard.preflight.gate.probe.runner import _last_json, _last_line
from podguard.records import Record

__all__ = ["CHILD_MODULE", "DEFAULT_BYTES", "AllreduceResult", "bus_bandwidth", "run_allreduce"]

CHILD_MODULE = "podguard.preflight.gate.probe.allreduce_child"
DEFAULT_BYTES = 1 << 30  # large enough to reach the links' bandwidth (nccl-tests peaks from ~1 GB up)
POLL_S = 0.02
TAIL_CHARS = 2000


@dataclass(frozen=True)
class AllreduceResult(Record):
    ok: bool
    busbw_gbps: float | None  # None when skipped or failed
    reason: str  # "" when measured; why it was skipped or failed otherwise
    duration_ms: float
    skipped: bool = False  # fewer than two GPUs: nothing to all-reduce across
    algbw_gbps: float | None = None  # bytes / time, before the bus-bandwidth factor
    gpus: tuple[int, ...] = ()  # NVML indices, in rank order


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-reduce of `nbytes` taking `seconds` across `ranks`, as nccl-tests
    defines them: algbw = size / time; busbw = algbw x 2(n-1)/n, the traffic each rank's link carries in a
    ring all-reduce, which makes the figure comparable with the link's bandwidth whatever n is."""
    if not seconds > 0 or ranks < 1:
        raise ValueError(f"cannot compute a bandwidth from {seconds!r} s across {ranks} ranks")
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def run_allreduce(
    targets: Sequence[tuple[int, str]],
    timeout_s: float,
    *,
    backend: str = "nccl",
    nbytes: int = DEFAULT_BYTES,
    target_s: float = 0.2,
    env: Mapping[str, str] | None = None,
) -> AllreduceResult:
    """All-reduce `nbytes` across the GPUs of `targets` ((NVML index, CUDA_VISIBLE_DEVICES id) pairs, in rank
    order) and report the bus bandwidth; `backend="gloo"` runs the same code on CPU processes. Fewer than two
    targets: skipped (ok, no bandwidth). Bad arguments: UsageError (64) before anything starts."""
    if not timeout_s > 0:
        raise UsageError(f"all-reduce timeout {timeout_s!r} is not valid; it must be > 0 seconds")
    if backend not in ("nccl", "gloo"):
        raise UsageError(f"all-reduce backend {backend!r} is not valid; choose nccl or gloo")
    if nbytes < 4 or nbytes % 4:
        raise UsageError(f"all-reduce size {nbytes!r} is not valid; it must be a positive multiple of 4 bytes")
    indices = [index for index, _ in targets]
    if len(set(indices)) != len(indices):
        raise UsageError(f"a GPU is listed twice for the all-reduce: {indices}")
    if len(targets) < 2:
        return AllreduceResult(True, None, "one GPU selected: no all-reduce to measure", 0.0, skipped=True)

    started = time.monotonic()
    child_env = _child_env(targets, backend, env)
    gpus = ", ".join(str(i) for i in indices)
    with tempfile.TemporaryDirectory(prefix="podguard-allreduce-") as tmp:
        ranks: list[_Rank] = []
        try:
            for rank in range(len(targets)):
                argv = [sys.executable, "-m", CHILD_MODULE, "--rank", str(rank), "--world", str(len(targets))]
                argv += ["--store", str(Path(tmp) / "store"), "--backend", backend, "--bytes", str(nbytes)]
                argv += ["--target-s", str(target_s)]
                ranks.append(_Rank.start(rank, argv, child_env, Path(tmp) / f"rank{rank}.out"))
            finished = _wait(ranks, started + timeout_s)
        finally:
            for item in ranks:
                item.kill_group()
        duration_ms = round((time.monotonic() - started) * 1000, 1)
        reports = [item.report() for item in ranks]
    if not finished:
        return AllreduceResult(
            False,
            None,
            f"all-reduce across GPUs {gpus} timed out after {timeout_s:g}s",
            duration_ms,
            gpus=tuple(indices),
        )
    failed = [rank for rank, (code, report, _) in enumerate(reports) if code != 0 or not (report or {}).get("ok")]
    if failed:
        rank = next((r for r in failed if not ranks[r].killed), failed[0])  # the one that failed, not its peers
        code, report, tail = reports[rank]
        why = (report or {}).get("error") or _last_line(tail) or f"exited {code}"
        reason = f"all-reduce rank {rank} (GPU {indices[rank]}) failed: {why}"
        return AllreduceResult(False, None, reason, duration_ms, gpus=tuple(indices))
    seconds = sum(float(r["seconds"]) for _, r, _ in reports if r) / len(reports)  # mean over ranks (nccl-tests)
    algbw, busbw = bus_bandwidth(int(reports[0][1]["bytes"]), seconds, len(reports))  # type: ignore[index]
    return AllreduceResult(True, round(busbw, 2), "", duration_ms, algbw_gbps=round(algbw, 2), gpus=tuple(indices))


# ----------------------------------------------------------------------------------------------------


def _child_env(targets: Sequence[tuple[int, str]], backend: str, env: Mapping[str, str] | None) -> dict[str, str]:
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["PYTHONUNBUFFERED"] = "1"
    if backend == "nccl":
        # every rank sees every selected GPU (peer access for NVLink/P2P) and uses the one at its rank
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(visible) for _, visible in targets)
        child_env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        child_env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one node: its ranks talk over loopback
    return child_env


class _Rank:
    """One rank's child: its process (own process group), its output file."""

    def __init__(self, proc: subprocess.Popen[bytes], output: IO[bytes], path: Path) -> None:
        self.proc, self.output, self.path = proc, output, path
        self.returncode: int | None = None
        self.killed = False  # still running when its group was killed (a timeout, or a peer failed)

    @classmethod
    def start(cls, rank: int, argv: list[str], env: dict[str, str], path: Path) -> _Rank:
        out = path.open("wb")
        try:
            proc = subprocess.Popen(
                dying_with(os.getpid(), argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed whole
            )
        except BaseException:
            out.close()
            raise
        return cls(proc, out, path)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.proc.poll()
        return self.returncode

    def kill_group(self) -> None:
        """SIGKILL the rank's process group: the rank if still running, and anything it left behind."""
        self.killed = self.poll() is None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.returncode = self.proc.wait() if self.returncode is None else self.returncode
        self.output.close()

    def report(self) -> tuple[int | None, dict[str, Any] | None, str]:
        """(exit status, 128+N when killed by signal N; its JSON line; the tail of its output)."""
        try:
            tail = self.path.read_bytes()[-TAIL_CHARS:].decode("utf-8", "replace")
        except OSError:
            tail = ""
        code = self.returncode
        return (128 - code if code is not None and code < 0 else code), _last_json(tail), tail


def _wait(ranks: list[_Rank], deadline: float) -> bool:
    """Until every rank exited (True), or one failed (True: its peers are killed by the caller), or the
    deadline passed (False)."""
    while True:
        codes = [item.poll() for item in ranks]
        if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)

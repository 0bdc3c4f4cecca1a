"""What the billing guards cost while a job runs: the idle sampler's NVML round, and the supervisor's CPU time.

    python bench/bench_guards.py            # on the fake 8-GPU node (the test suite's libnvidia-ml.so.1)
    python bench/bench_guards.py --real     # on this machine's GPUs and driver (a GPU host)

1. One sampler round (one nvmlDeviceGetUtilizationRates per GPU, handles cached), timed in-process.
2. `podguard run` supervising a job that sleeps, without guards and with --idle-stop at several sample intervals
   (PODGUARD_GUARD_INTERVAL; 10 s is the default): the podguard process's own CPU time (its threads' on-CPU
   nanoseconds from /proc/PID/task/*/schedstat; the job excluded) over a window after start-up, scaled to a
   minute. BENCH_GUARD_WINDOW_S sets the window (default 10 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from _common import PODGUARD, ROOT, fake_node, node_env

WINDOW_S = float(os.environ.get("BENCH_GUARD_WINDOW_S", "10"))
INTERVALS = ("10", "1", "0.1")
JOB = [sys.executable, "-c", "import time; print('job ready', flush=True); time.sleep(3600)"]
TICK = os.sysconf("SC_CLK_TCK")


def sampler_round_us(rounds: int = 2000) -> tuple[int, float]:
    """(GPUs, microseconds per sampler round) in this process."""
    sys.path.insert(0, str(ROOT / "entrypoint"))
    from podguard.gpu.nvml import NvmlBackend
    from podguard.guards.sampler import UtilizationSampler

    with NvmlBackend() as backend:
        sampler = UtilizationSampler(backend, range(backend.device_count()))
        sampler.sample()  # handles cached, as in the guard
        started = time.perf_counter()
        for _ in range(rounds):
            sampler.sample()
        return len(sampler.indices), (time.perf_counter() - started) / rounds * 1e6


def cpu_s(pid: int) -> float:
    """On-CPU seconds of the process's threads (schedstat: nanoseconds; utime+stime ticks where it is absent)."""
    total, seen = 0, False
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
                seen = True
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    if seen:
        return total / 1e9
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _wait_until_quiet(pid: int, deadline: float, step_s: float = 0.2, quiet_s: float = 0.002) -> None:
    """Poll the supervisor's CPU time until a step adds less than `quiet_s` (or the deadline passes)."""
    last = cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(step_s)
        now = cpu_s(pid)
        if now - last < quiet_s:
            return
        last = now


def supervisor_cpu_ms_per_min(env: dict[str, str], extra: list[str]) -> float:
    proc = subprocess.Popen(
        [*PODGUARD, "run", *extra, "--", *JOB],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "job ready" in line:
                break
        else:
            raise SystemExit(f"the job did not start: exit {proc.wait()}")
        _wait_until_quiet(proc.pid, deadline=time.monotonic() + 5.0)  # start-up's last work (log threads) done
        before, started = cpu_s(proc.pid), time.monotonic()
        time.sleep(WINDOW_S)
        used, elapsed = cpu_s(proc.pid) - before, time.monotonic() - started
        return used / elapsed * 60 * 1000
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main() -> int:
    real = "--real" in sys.argv
    node = None if real else fake_node(8)
    try:
        env = node_env(node) if node is not None else {**os.environ, "PODGUARD_PROBE": "off"}
        if node is not None:
            os.environ.update({k: v for k, v in node.env_vars().items()})
        gpus, per_round = sampler_round_us()
        where = "this machine's driver" if real else "the fake NVML"
        print(f"sampler round on {gpus} GPU(s), {where}: {per_round:.1f} us ({per_round / gpus:.1f} us per GPU)")
        rows: list[tuple[str, ...]] = [
            ("guards", "sample interval", "supervisor CPU ms/min", "sampler alone ms/min (est.)")
        ]
        rows.append(("none", "-", f"{supervisor_cpu_ms_per_min(env, []):.2f}", "0"))
        for interval in INTERVALS:
            guarded = {**env, "PODGUARD_GUARD_INTERVAL": interval}
            measured = supervisor_cpu_ms_per_min(guarded, ["--idle-stop", "1h", "--max-runtime", "2h"])
            estimate = per_round * 60 / float(interval) / 1000
            rows.append(("--idle-stop 1h --max-runtime 2h", f"{interval} s", f"{measured:.2f}", f"{estimate:.3f}"))
        print(f"window {WINDOW_S:g} s per run")
        print(table(rows))
    finally:
        if node is not None:
            node.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

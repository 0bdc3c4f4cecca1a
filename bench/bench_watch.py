"""What the run-time watch costs and how fast it finds a hang (issue 19).

    python bench/bench_watch.py             # on the fake 8-GPU node (the test suite's libnvidia-ml.so.1)

1. `heartbeat(step)` per call, in-process, with podguard's board (and without one: a no-op); `with busy(...):`.
2. The supervisor's own CPU while a job sleeps on 8 GPUs, with the watches podguard always runs (the heartbeat
   board and the GPU fault watch, one tick a second) and with `--hang-timeout 1h --progress REGEX` on top:
   milliseconds of CPU per minute and percent of one core (the job itself excluded).
3. Hang detection latency: a 2-worker job prints a line and hangs; from the moment podguard printed that line
   to podguard's exit, minus `--hang-timeout` (the workers die at SIGTERM: no grace is spent); and the stack capture's
   time per worker from the run's hang record.
4. A hung job with a py-spy that cannot be ended (blocked in the kernel on a FUSE file that never answers, as
   root with /dev/fuse; else one that ignores SIGTERM): last line -> podguard's exit, against the contract's
   --hang-timeout + 60 s (PODGUARD_HANG_END_S left at its default). `--quick` skips it (it takes about a minute).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from _common import PODGUARD, ROOT, fake_node, node_env
from bench_guards import supervisor_cpu_ms_per_min, table

HANG_TIMEOUT_S = 2.0
GRACE_S = 1.0
STUCK = "import time\nprint('ready', flush=True)\ntime.sleep(3600)\n"


def heartbeat_us() -> tuple[float, float, float]:
    """heartbeat(1) with a board and without one; a `with busy("saving"):` (enter and exit) with a board."""
    sys.path.insert(0, str(ROOT / "entrypoint"))
    import podguard.rank.progress as hb
    from podguard.rank.busy import busy

    def announce() -> None:
        with busy("saving"):
            pass

    hb._reset_for_tests()
    without = min(timeit.repeat(lambda: hb.heartbeat(1), number=100_000, repeat=5)) / 100_000 * 1e6
    board = hb.create_board(Path(tempfile.mkdtemp()) / "hb", 8)
    os.environ[hb.ENV_FILE] = str(board)
    hb._reset_for_tests()
    with_board = min(timeit.repeat(lambda: hb.heartbeat(1), number=100_000, repeat=5)) / 100_000 * 1e6
    busy_us = min(timeit.repeat(announce, number=100_000, repeat=5)) / 100_000 * 1e6
    hb._reset_for_tests()
    del os.environ[hb.ENV_FILE]
    return with_board, without, busy_us


def _hung_run(env: dict[str, str], state: Path, args: list[str], extra: dict[str, str]) -> float:
    """Run a job that prints a line and hangs; seconds from that line to podguard's exit (which must be 79)."""
    job = state / "stuck.py"
    job.write_text(STUCK)
    proc = subprocess.Popen(
        [*PODGUARD, *args, "--", sys.executable, str(job)],
        env={**env, "LD_LIBRARY_PATH": "", "PODGUARD_STATE_DIR": str(state), **extra},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    last = None
    for line in proc.stdout:
        if line.rstrip().endswith("ready"):
            last = time.monotonic()
    code = proc.wait()
    if code != 79 or last is None:
        raise SystemExit(f"expected exit 79 after a line, got {code}")
    return time.monotonic() - last


def hang_latency(env: dict[str, str], state: Path) -> tuple[float, list[float]]:
    """(seconds from the last line to exit beyond the timeout and the grace, stack capture ms per worker)."""
    args = ["train", "--mode", "per-gpu", "--hang-timeout", str(HANG_TIMEOUT_S), "--grace", str(GRACE_S)]
    took = _hung_run(env, state, args, {"PODGUARD_CPU_WORKERS": "2"})
    record = json.loads(next(state.glob("runs/*/hang/hang.json")).read_text())
    per_worker = [s["duration_ms"] for s in record.get("stacks", []) if s.get("path")]
    return took - HANG_TIMEOUT_S, per_worker


def blocked_py_spy_end(env: dict[str, str], state: Path) -> tuple[float, str]:
    """(seconds from the job's last line to podguard's exit, which stand-in py-spy blocked)."""
    sys.path.insert(0, str(ROOT / "tests" / "launch"))
    from fuse_stall import StallFs

    fake = state / "py-spy"
    with contextlib.ExitStack() as stack:
        if StallFs.available():
            fs = stack.enter_context(StallFs(state / "mnt"))
            fake.write_text(f"#!/bin/sh\nexec cat {fs.file}\n")
            kind = "blocked in the kernel (FUSE read, D state past SIGKILL)"
        else:
            fake.write_text(f"#!{sys.executable}\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                            "time.sleep(3600)\n")  # fmt: skip
            kind = "ignoring SIGTERM"
        fake.chmod(0o755)
        args = ["run", "--hang-timeout", str(HANG_TIMEOUT_S), "--grace", str(GRACE_S)]
        return _hung_run(env, state, args, {"PODGUARD_PY_SPY": str(fake)}), kind


def main() -> int:
    with_board, without, busy_us = heartbeat_us()
    print(f"heartbeat(step): {with_board:.2f} us per call with podguard's board, {without:.3f} us without one")
    print(f'with busy("saving"): {busy_us:.2f} us per announcement (its start and its end) with the board')
    node = fake_node(8)
    try:
        env = node_env(node)
        rows: list[tuple[str, ...]] = [("watches", "supervisor CPU ms/min", "% of one core")]
        for label, extra in (
            ("always on (board, GPU faults)", []),
            ("+ --hang-timeout 1h --progress", ["--hang-timeout", "1h", "--progress", r"step \d+"]),
        ):
            ms = supervisor_cpu_ms_per_min(env, extra)
            rows.append((label, f"{ms:.1f}", f"{ms / 600:.3f}"))
        print(table(rows))
        samples = []
        for _ in range(3):
            with tempfile.TemporaryDirectory() as state:
                samples.append(hang_latency(env, Path(state)))
        beyond = [s[0] for s in samples]
        capture = [ms for s in samples for ms in s[1]]
        print(
            f"hang detection: last line -> podguard's exit, minus --hang-timeout {HANG_TIMEOUT_S:g} s (the tick, the "
            f"evidence, SIGTERM): median {statistics.median(beyond):.2f} s (runs: "
            f"{', '.join(f'{b:.2f}' for b in beyond)})"
        )
        if capture:
            print(f"stack capture per worker: median {statistics.median(capture):.0f} ms (max {max(capture):.0f} ms)")
        if "--quick" not in sys.argv:
            with tempfile.TemporaryDirectory() as state:
                took, kind = blocked_py_spy_end(env, Path(state))
            print(
                f"hung job with a py-spy {kind}: last line -> exit {took:.1f} s "
                f"(contract: --hang-timeout {HANG_TIMEOUT_S:g} s + 60 s = {HANG_TIMEOUT_S + 60:g} s)"
            )
    finally:
        node.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

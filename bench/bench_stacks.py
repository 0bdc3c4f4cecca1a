"""Stack capture time per worker: `capture_stacks` on real torch ranks hung in a collective, one rank stuck.

Default (CPU, gloo): N ranks of tests/launch/hang_evidence_job.py (rank 1 sleeps in user code, the others wait
in all_reduce), then `capture_stacks` on all of them, repeated; prints the wall time of the whole capture and
each worker's py-spy time. `--nccl` (a GPU machine): the same shape on NCCL with torch's flight recorder armed
by `flight_recorder_env`, dumped through its pipe by `trigger_flight_dump`, plus the host's ptrace facts;
`--out DIR` keeps the stacks, the dumps and a JSON report.

Run: `python bench/bench_stacks.py [--workers 2 4] [--repeats 5]`
     `python bench/bench_stacks.py --nccl --out DIR`
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "entrypoint"))

from loopback import free_port  # noqa: E402
from podguard.launch.watch.flight import flight_recorder_env, installed_torch_version, trigger_flight_dump  # noqa: E402
from podguard.launch.watch.stacks import (  # noqa: E402
    capture_stacks,
    find_py_spy,
    find_rank_processes,
    hang_summary,
    ptrace_diagnosis,
)

HEADS: dict[int, str] = {}  # pid -> what the rank printed up to `ready`
NEW_ONLY = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # --names new: drop these
OLD_ONLY = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE")  # --names old
GLOO_JOB = ROOT / "tests" / "launch" / "hang_evidence_job.py"
NCCL_JOB = textwrap.dedent(
    """
    import datetime, os, sys, time
    import torch
    import torch.distributed as dist

    def load_batch():
        while True:
            time.sleep(0.05)

    def step(t):
        dist.all_reduce(t)
        return t.sum().item()

    def main():
        torch.cuda.set_device(int(os.environ.get("HANG_DEVICE", os.environ["LOCAL_RANK"])))
        timeout = datetime.timedelta(seconds=int(os.environ.get("HANG_NCCL_TIMEOUT", "600")))
        dist.init_process_group("nccl", timeout=timeout)
        rank = dist.get_rank()
        t = torch.ones(1 << 16, device="cuda")
        for _ in range(3):
            step(t)
        print(f"ready {rank} {os.getpid()}", flush=True)
        if rank == int(os.environ.get("HANG_STUCK_RANK", "1")):
            load_batch()
        step(t)
        load_batch()

    main()
    """
)


def start_ranks(script: Path, world: int, extra: dict[str, str], ready_s: float) -> list[subprocess.Popen[str]]:
    """`world` ranks (env:// on loopback); returns once each printed `ready` (else kills them and raises)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, **extra, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    if not wait_ready(procs, time.monotonic() + ready_s):
        stop(procs)
        said = " | ".join((HEADS.get(p.pid, "") + tail(p))[-700:] for p in procs)
        raise RuntimeError(f"the ranks did not all get ready (exit codes {[p.returncode for p in procs]}): {said}")
    time.sleep(0.5)  # into the collective
    return procs


def wait_ready(procs: list[subprocess.Popen[str]], deadline: float) -> bool:
    """Until every rank printed `ready` (select: a rank that never prints cannot block this past `deadline`)."""
    waiting = {p.stdout.fileno(): p for p in procs if p.stdout}
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(list(waiting), [], [], 0.2)
        for fd in readable:
            chunk = os.read(fd, 65536)
            pid = waiting[fd].pid
            HEADS[pid] = HEADS.get(pid, "") + chunk.decode(errors="replace")
            if "ready " in HEADS[pid]:
                del waiting[fd]
            elif not chunk:
                return False
    return not waiting


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def bench_cpu(workers: list[int], repeats: int) -> None:
    if find_py_spy() is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    for world in workers:
        procs = start_ranks(GLOO_JOB, world, {}, 180)
        try:
            pids = {f"CPU{i}": p.pid for i, p in enumerate(procs)}
            walls, per = [], []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as out:
                    started = time.perf_counter()
                    stacks = capture_stacks(find_rank_processes(pids), Path(out))
                    walls.append(time.perf_counter() - started)
                    per += [s.duration_ms for s in stacks]
                    assert all(s.error is None for s in stacks), [s.error for s in stacks]
            print(
                f"{world} ranks (gloo, torch loaded): whole capture median {statistics.median(walls) * 1000:.0f} ms"
                f" (max {max(walls) * 1000:.0f}); per worker median {statistics.median(per):.0f} ms,"
                f" max {max(per):.0f} ms, over {repeats} captures"
            )
            print("  " + "\n  ".join(hang_summary(stacks)))
        finally:
            stop(procs)


def host_facts() -> dict[str, object]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "absent"

    status = dict(
        line.split(":", 1) for line in read("/proc/self/status").splitlines() if line.startswith(("Cap", "Seccomp"))
    )
    return {
        "yama_ptrace_scope": read("/proc/sys/kernel/yama/ptrace_scope"),
        "status": {k: v.strip() for k, v in status.items()},
        "uid": os.getuid(),
        "kernel": os.uname().release,
        "diagnosis_if_refused": ptrace_diagnosis(),
    }


def summarize_dump(path: Path) -> dict[str, object]:
    """What a flight-recorder dump holds: its version, entry count, and the last entries' op and state."""
    try:
        data = pickle.loads(path.read_bytes())
    except Exception as exc:
        return {"file": path.name, "bytes": path.stat().st_size, "unpickle": repr(exc)[:200]}
    entries = data.get("entries", []) if isinstance(data, dict) else []
    last = [
        {k: e.get(k) for k in ("profiling_name", "state", "collective_seq_id", "time_discovered_completed_ns")}
        for e in entries[-3:]
    ]
    return {"file": path.name, "bytes": path.stat().st_size, "keys": sorted(data)[:12], "entries": len(entries),
            "version": data.get("version"), "last": last}  # fmt: skip


def native_dump(pid: int) -> dict[str, object]:
    """py-spy --native on one rank: the C++ frames a NCCL wait hides from the Python stack, and its cost."""
    py_spy = find_py_spy()
    if py_spy is None:
        return {"error": "no py-spy"}
    started = time.perf_counter()
    try:
        out = subprocess.run(
            [py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return {"error": "py-spy --native took over 60 s"}
    return {"ms": round((time.perf_counter() - started) * 1000), "rc": out.returncode, "text": out.stdout[-3000:],
            "stderr": out.stderr[-500:]}  # fmt: skip


def bench_nccl(out: Path, watchdog_s: int, names: str, world: int) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="podguard-nccl-"))
    script = work / "nccl_job.py"
    script.write_text(NCCL_JOB)
    flight = work / "flight"
    version = installed_torch_version() if names == "auto" else None
    armed = flight_recorder_env(flight, os.environ, torch_version=version)
    drop = NEW_ONLY if names == "new" else OLD_ONLY if names == "old" else ()
    armed = {k: v for k, v in armed.items() if k not in drop}
    report: dict[str, object] = {"host": host_facts(), "torch": torch.__version__, "armed": armed}
    report["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    extra = {**armed, "HANG_NCCL_TIMEOUT": str(watchdog_s)}
    if torch.cuda.device_count() < 2:
        extra["HANG_DEVICE"] = "0"
    if world == 1:
        extra["HANG_STUCK_RANK"] = "0"
    try:
        procs = start_ranks(script, world, extra, 240)
    except RuntimeError as exc:
        report["two_ranks"] = f"failed: {exc}; one rank instead"
        world, extra["HANG_STUCK_RANK"] = 1, "0"
        procs = start_ranks(script, world, extra, 240)
    report["world"] = world
    try:
        report["pipes"] = sorted(str(p.relative_to(flight)) for p in flight.rglob("*"))
        started = time.perf_counter()
        dumps = trigger_flight_dump(flight, timeout_s=10)
        report["trigger_s"] = round(time.perf_counter() - started, 3)
        report["dumps"] = [summarize_dump(p) for p in dumps]
        for p in dumps[:2]:
            shutil.copy(p, out / f"fr_{p.name}")
        pids = {f"GPU{i}": p.pid for i, p in enumerate(procs)}
        stacks = capture_stacks(find_rank_processes(pids, gpus={n: (0,) for n in pids}), work / "stacks")
        report["stacks_ms"] = [round(s.duration_ms) for s in stacks]
        report["stack_errors"] = [s.error for s in stacks]
        report["summary"] = hang_summary(stacks)
        for s in stacks[:2]:
            if s.path:
                shutil.copy(s.path, out / f"stacks_{s.path.name}")
        report["native_rank0"] = native_dump(procs[0].pid)
        if world > 1 and watchdog_s:
            report["watchdog"] = wait_watchdog_dump(flight, dumps, watchdog_s + 30)
    finally:
        stop(procs)
        report["outputs"] = [(HEADS.get(p.pid, "") + tail(p))[-4000:] for p in procs]
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k not in ("outputs", "native_rank0")}, indent=2))


def tail(proc: subprocess.Popen[str]) -> str:
    """The rank's last output (it has exited: read what is left, without blocking on a pipe a child holds)."""
    if proc.stdout is None:
        return ""
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        return (os.read(proc.stdout.fileno(), 1 << 20) or b"").decode(errors="replace")[-1500:]
    except OSError:
        return ""


def wait_watchdog_dump(flight: Path, earlier: list[Path], wait_s: float) -> dict[str, object]:
    """Whether torch's own watchdog rewrote a dump on its timeout (TORCH_NCCL_DUMP_ON_TIMEOUT)."""
    before = {p: p.stat().st_mtime_ns for p in earlier if p.exists()}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        changed = [p.name for p in flight.glob("nccl_trace_rank_*") if before.get(p) != p.stat().st_mtime_ns]
        if changed:
            return {"rewritten": changed, "after_s": round(wait_s - (deadline - time.monotonic()), 1)}
        time.sleep(0.2)
    return {"rewritten": [], "waited_s": wait_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nccl", action="store_true", help="a real NCCL hang on this machine's GPU(s)")
    parser.add_argument("--out", type=Path, default=Path("bench-stacks-out"))
    parser.add_argument("--watchdog", type=int, default=20, help="NCCL timeout (s) of the --nccl job; 0: skip")
    parser.add_argument("--names", choices=("auto", "both", "new", "old"), default="auto", help="--nccl: which names")
    parser.add_argument("--world", type=int, default=2, help="--nccl: ranks (2 on one GPU may be refused)")
    args = parser.parse_args()
    if args.nccl:
        bench_nccl(args.out, args.watchdog, args.names, args.world)
    else:
        bench_cpu(args.workers, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())

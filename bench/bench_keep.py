"""`pod keep` against the test suite's stand-in RunPod: how fast a job comes back, and what watching it costs.

1. Recovery time. The job's pod is EXITED (maintenance: the keeper starts it) or in ERROR (the keeper replaces it
   on a new machine); the figure is the time from that event to the recovered pod's preflight PASS line reaching
   the keeper, minus the stand-in's own boot time for that recovery (RunPod's part: provisioning, container start,
   the preflight), i.e. what the keeper itself adds: noticing (at most one --poll), the settle window before a
   status-only decision (PODGUARD_KEEP_SETTLE_S, 3 s), the API calls, and the recovery poll (5 s at most) that
   sees the new pod run before its log stream is opened.
2. Requests while a healthy job runs: the keeper's requests over a window in which the job prints a line a
   second and nothing happens, per poll and extrapolated to an hour at the default --poll 30 (target: at most
   130 per pod, one log stream; the status request is the one listing of the name a poll, `GET /v2/pods`, or
   `GET /v2/clusters` for a cluster). For a pod and for a 4-node cluster.

Run: `python bench/bench_keep.py [--polls 5,30] [--runs 3] [--window-s 60]`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from _common import PODGUARD, ROOT, compile_bytecode

sys.path.insert(0, str(ROOT / "tests" / "pods"))
from standin_api import Recorded, StandIn
from standin_state import PodRecord, Timing, World

KEY = "rpa_BENCHKEY0123456789abcdefghijklmnop"
SPEC = """
name = "{name}"
image = "registry.example/me/podguard:0.2"
args = "train -- python train.py"
[gpu]
types = ["NVIDIA A40"]
count = 2
{cluster}
[network_volume]
id = "vol-bench"
path = "/workspace"
"""
BOOT = Timing(provision_s=3.0, start_s=2.0, verdict_delay_s=1.0, keepalive_s=0.5)  # the stand-in's "RunPod"


def _env(api: StandIn, home: Path, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODGUARD_")}
    env.update(RUNPOD_API_BASE_URL=api.url, RUNPOD_API_KEY=KEY, HOME=str(home), PODGUARD_STATE_DIR=str(state))
    env["PODGUARD_KEEPERS_DIR"] = str(state.parent / f"keepers-{state.name}")  # one machine per run
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _events(state: Path, name: str) -> list[dict]:
    path = state / "keep" / f"{name}.events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def _passes(state: Path, name: str) -> list[dict]:
    return [e for e in _events(state, name) if e["event"] == "verdict" and "PASS" in e["text"]]


def _live(world: World, name: str) -> PodRecord:
    with world.lock:
        (pod,) = [p for p in world.pods.values() if p.name == name and p.status != "TERMINATED"]
        return pod


def recovery_once(event: str, poll: float, work: Path, tag: str) -> tuple[float, float]:
    """(seconds from the event to the recovered pod's PASS at the keeper, the stand-in's boot time for it)."""
    api = StandIn(KEY, BOOT).start()
    home, state = work / f"home-{tag}", work / f"state-{tag}"
    home.mkdir()
    proc = None
    try:
        api.world.set_capacity("NVIDIA A40", 1000)
        spec = work / f"{tag}.toml"
        spec.write_text(SPEC.format(name=tag, cluster=""))
        proc = subprocess.Popen(
            [*PODGUARD, "pod", "keep", "--spec", str(spec), "--poll", f"{poll:g}"],
            env=_env(api, home, state),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: _passes(state, tag), 120, "the first PASS")
        time.sleep(poll * (0.2 + 0.6 * (hash(tag) % 100) / 100))  # the event lands anywhere between two polls
        pod = _live(api.world, tag)
        at = time.time()
        if event == "EXITED":
            api.world.emit(pod.id, "podguard train: END signal exit 143 after 1 attempt(s)")
            api.world.act(pod.id, "stop")
            boot = BOOT.start_s + BOOT.verdict_delay_s
        else:
            api.world.set_error(pod.id)
            boot = BOOT.provision_s + BOOT.start_s + BOOT.verdict_delay_s
        second = wait_until(lambda: _passes(state, tag)[1:], 300, "the recovered pod's PASS")[0]
        _live(api.world, tag)  # exactly one pod of the name
        return second["t"] - at, boot
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        api.close()


def _kind(rec: Recorded) -> str:
    if rec.method == "GET" and rec.path.endswith("/logs"):
        return "log stream opened"
    if rec.method == "GET" and rec.path in ("/v2/pods", "/v2/clusters"):
        return "status"  # the keeper's one listing of the name a poll
    return f"{rec.method} {rec.path}"


def requests_while_healthy(nodes: int, poll: float, window_s: float, work: Path) -> tuple[Counter[str], float, int]:
    """(requests by kind in the window, the window's length, polls in it) while a healthy job prints."""
    tag = f"steady-{nodes}"
    api = StandIn(KEY, Timing(keepalive_s=15.0)).start()  # RunPod-like keep-alives on a quiet stream
    home, state = work / f"home-{tag}", work / f"state-{tag}"
    home.mkdir()
    proc = None
    stop = threading.Event()
    try:
        api.world.set_capacity("NVIDIA A40", 1000)
        spec = work / f"{tag}.toml"
        spec.write_text(SPEC.format(name=tag, cluster=f"[cluster]\nnodes = {nodes}\n" if nodes > 1 else ""))
        proc = subprocess.Popen(
            [*PODGUARD, "pod", "keep", "--spec", str(spec), "--poll", f"{poll:g}"],
            env=_env(api, home, state),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: len(_passes(state, tag)) >= nodes, 120, "every node's PASS")
        with api.world.lock:
            pods = [p.id for p in api.world.pods.values() if p.status == "RUNNING"]

        def job() -> None:  # a line a second on every node
            step = 0
            while not stop.wait(1.0):
                step += 1
                for pid in pods:
                    api.world.emit(pid, f"step {step} loss {1 / step:.4f}")

        threading.Thread(target=job, daemon=True).start()
        time.sleep(poll)
        start, before = time.monotonic(), len(api.requests)
        time.sleep(window_s)
        window = time.monotonic() - start
        during = api.requests[before:]
        return Counter(_kind(r) for r in during), window, round(window / poll)
    finally:
        stop.set()
        if proc is not None:
            proc.terminate()
            proc.wait()
        api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", default="5,30", help="--poll values for the recovery runs (seconds)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--steady-poll", type=float, default=1.0, help="--poll while counting requests")
    parser.add_argument("--requests-only", action="store_true", help="skip the recovery runs (1.)")
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="podguard-bench-keep-") as tmp:
        work = Path(tmp)
        print(
            "1. event -> recovered pod's preflight PASS at the keeper (stand-in boot: provision "
            f"{BOOT.provision_s:g} s, start {BOOT.start_s:g} s, preflight {BOOT.verdict_delay_s:g} s)"
        )
        header = ("event", "--poll", "runs", "total med", "boot", "keeper med", "keeper max")
        print("{:<8} {:>6} {:>4} {:>10} {:>6} {:>11} {:>11}".format(*header))
        for poll in () if args.requests_only else (float(p) for p in args.polls.split(",")):
            for event in ("EXITED", "ERROR"):
                totals, added = [], []
                boot = 0.0
                for i in range(args.runs):
                    total, boot = recovery_once(event, poll, work, f"{event.lower()}-{poll:g}-{i}")
                    totals.append(total)
                    added.append(total - boot)
                print(
                    f"{event:<8} {poll:>6g} {args.runs:>4} {statistics.median(totals):>9.2f}s {boot:>5.1f}s "
                    f"{statistics.median(added):>10.2f}s {max(added):>10.2f}s",
                    flush=True,
                )
        print(f"\n2. requests while a healthy job runs (--poll {args.steady_poll:g}, {args.window_s:g} s window)")
        for nodes in (1, 4):
            kinds, window, polls = requests_while_healthy(nodes, args.steady_poll, args.window_s, work)
            total = sum(kinds.values())
            per_poll = kinds["status"] / max(polls, 1)
            hour = 3600 / 30 * per_poll + kinds["log stream opened"] * 3600 / window
            what = "pod" if nodes == 1 else f"{nodes}-node cluster"
            print(
                f"{what:<16} {total} requests in {window:.0f} s ({dict(kinds)}): {per_poll:.2f} status request(s) per "
                f"poll -> at --poll 30: {hour:.0f} per hour, log streams held open: {nodes}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

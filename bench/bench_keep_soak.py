"""`pod keep` soak against the test suite's stand-in RunPod: a seeded, randomized night of faults.

A real keeper process (`podguard pod keep`, fast knobs) keeps one pod while a seeded random driver, for a few
hundred events (bounded in time), does what real nights do:
- faults on every request kind the keeper sends: the status GET, the pod listing (the lookup by name), the create,
  the actions (start, stop), the terminate (a DELETE), the log stream; as an HTML 502, a 500, a 429, a dropped
  connection, a "lost" answer (done, then the connection dropped), a slow answer; 1 to 4 in a row (some outlast
  --retry-for);
- what RunPod does to the pod: a stop for maintenance (END signal, then EXITED), ERROR, a vanished pod, a lost
  host (RUNNING, no runtime, silent), a preflight that fails, a resume with zero GPUs;
- SIGKILL of the keeper at random points, started again after a moment (as RunPod restarts a keeper pod);
- a second actor: `pod heal --replace` from another machine (an identical pod of the name is created, then the
  old one terminated), and a second keeper process (another state dir) that lives for a while.
At the end the faults stop, the job prints `END success`, and the keeper must stop the pod and exit 0.

Figures: duplicates (two pods of the name that both exist for longer than --twin-s while no actor is mid-way
through its own replace), pods left billing (RUNNING/STARTING/PROVISIONING pods of the name after the keeper
ended), keeper exits other than the final one (each restarted, as RunPod would), and the requests made.

Run: `python bench/bench_keep_soak.py [--seed 7] [--events 300] [--max-s 420]`
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from _common import PODGUARD, ROOT, compile_bytecode
from bench_keep import wait_until

sys.path.insert(0, str(ROOT / "tests" / "pods"))
from standin_api import StandIn
from standin_state import PodRecord, Timing, same_as

KEY = "rpa_SOAKKEY0123456789abcdefghijklmnop"
NAME = "soak"
SPEC = f"""
name = "{NAME}"
image = "registry.example/me/podguard:0.2"
args = "train -- python train.py"
[gpu]
types = ["NVIDIA A40"]
count = 2
[network_volume]
id = "vol-soak"
path = "/workspace"
[ready]
timeout_s = 20
"""
KNOBS = {
    "PODGUARD_KEEP_SILENCE_S": "2",
    "PODGUARD_KEEP_SETTLE_S": "0.2",
    "PODGUARD_KEEP_RECOVERY_POLL_S": "0.2",
    "PODGUARD_KEEP_CAPACITY_WAIT_S": "0.2",
    "PODGUARD_KEEP_CAPACITY_WAIT_CAP_S": "0.5",
    "PODGUARD_KEEP_NOTIFY_S": "1",
    "PODGUARD_API_BACKOFF_S": "0.01",
    "PODGUARD_API_BACKOFF_CAP_S": "0.05",
    "PODGUARD_API_TIMEOUT_S": "3",
    "PODGUARD_POD_POLL_S": "0.05",
    "PODGUARD_POD_SETTLE_S": "0.1",
}
ROUTES = [  # every request kind the keeper sends
    ("GET", r"^/v2/pods/[^/]+$"),
    ("GET", r"^/v2/pods$"),
    ("POST", r"^/v2/pods$"),
    ("POST", r"/action$"),
    ("DELETE", r"^/v2/pods/[^/]+$"),  # terminate (REST v2: DELETE /v2/pods/{id}): twins, replacements
    ("GET", r"/logs$"),
]
FAULTS = ("html502", "500", "429", "drop", "lost", "slow")
BILLING = ("RUNNING", "STARTING", "PROVISIONING")


class KeeperProc:
    """One `pod keep` process at a time, started again whenever it ends (as RunPod restarts a keeper pod)."""

    def __init__(self, spec: Path, env: dict[str, str], log: Path) -> None:
        self.spec, self.env, self.log = spec, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: Counter[int] = Counter()
        self.kills = 0

    def start(self) -> None:
        args = [*PODGUARD, "pod", "keep", "--spec", str(self.spec), "--poll", "0.25", "--retry-for", "0.3"]
        args += ["--max-recoveries", "100000"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self.exits[self.proc.returncode] += 1
            self.start()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.kills += 1
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def _live(api: StandIn) -> list[PodRecord]:
    with api.world.lock:
        return [p for p in api.world.pods.values() if p.name == NAME and p.status != "TERMINATED"]


def _events(state: Path) -> list[dict]:
    path = state / "keep" / f"{NAME}.events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a SIGKILL
    return out


class Watch(threading.Thread):
    """Samples the pods of the name every 20 ms: twin episodes (both alive longer than twin_s, no actor mid-way)."""

    def __init__(self, api: StandIn, twin_s: float) -> None:
        super().__init__(daemon=True)
        self.api, self.twin_s = api, twin_s
        self.actor_busy = threading.Event()
        self.halt = threading.Event()
        self.duplicates: list[tuple[str, ...]] = []
        self.max_live = 0

    def run(self) -> None:
        since: dict[tuple[str, ...], float] = {}
        while not self.halt.wait(0.02):
            live = tuple(sorted(p.id for p in _live(self.api)))
            self.max_live = max(self.max_live, len(live))
            if len(live) < 2 or self.actor_busy.is_set():
                since.clear()
                continue
            first = since.setdefault(live, time.monotonic())
            if time.monotonic() - first > self.twin_s and live not in self.duplicates:
                self.duplicates.append(live)


def soak(seed: int, events: int, max_s: float, twin_s: float, work: Path) -> dict[str, object]:
    rng = random.Random(seed)
    api = StandIn(KEY, Timing(provision_s=0.3, start_s=0.2, verdict_delay_s=0.1, keepalive_s=0.5)).start()
    api._server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a killed keeper's broken pipes
    api.world.set_capacity("NVIDIA A40", 100_000)
    home, state = work / "home", work / "state"
    home.mkdir()
    spec = work / "soak.toml"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODGUARD_")}
    env.update(RUNPOD_API_BASE_URL=api.url, RUNPOD_API_KEY=KEY, HOME=str(home), PODGUARD_STATE_DIR=str(state))
    env.update(KNOBS)
    keeper = KeeperProc(spec, env, work / "keeper.log")
    second = KeeperProc(spec, {**env, "PODGUARD_STATE_DIR": str(work / "state2")}, work / "second.log")
    watch = Watch(api, twin_s)
    done: Counter[str] = Counter()
    acted: Counter[str] = Counter()
    started = time.monotonic()
    try:
        keeper.start()
        watch.start()
        wait_until(
            lambda: any(e["event"] == "verdict" and "PASS" in e["text"] for e in _events(state)), 60, "first PASS"
        )
        second_until = 0.0
        while sum(done.values()) < events and time.monotonic() - started < max_s:
            time.sleep(rng.uniform(0.15, 0.6))
            keeper.check()
            if second.proc is not None:
                if time.monotonic() > second_until:
                    second.stop()
                    second.proc = None
                else:
                    second.check()
            what = rng.choices(
                ["fault", "maintenance", "error", "vanish", "lose_host", "unhealthy", "gpu0", "kill", "heal",
                 "second", "noise"],
                weights=[30, 8, 6, 4, 3, 3, 2, 10, 3, 2, 29],
            )[0]  # fmt: skip
            done[what] += 1
            live = [p for p in _live(api) if p.status == "RUNNING" and not p.host_lost]
            pod = rng.choice(live) if live else None
            if what == "fault":
                method, path = rng.choice(ROUTES)
                kind = rng.choice(FAULTS)
                api.fault(method, path, kind, times=rng.randint(1, 4), delay=0.5)
            elif what == "maintenance" and pod is not None:
                api.world.emit(pod.id, "podguard train: END signal exit 143 after 1 attempt(s): received SIGTERM")
                time.sleep(0.05)
                _quiet(api.world.act, pod.id, "stop")
            elif what == "error" and pod is not None:
                _quiet(api.world.set_error, pod.id)
            elif what == "vanish" and pod is not None:
                _quiet(api.world.vanish, pod.id)
            elif what == "lose_host" and pod is not None:
                _quiet(api.world.lose_host, pod.id)
            elif what == "unhealthy" and pod is not None:
                for _ in range(3):
                    api.world.emit(pod.id, "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms")
            elif what == "gpu0":
                api.world.gpus_on_start = 0  # the next start of a stopped pod gets no GPUs
                threading.Timer(3.0, lambda: setattr(api.world, "gpus_on_start", None)).start()
            elif what == "kill":
                keeper.kill()
                time.sleep(rng.uniform(0.05, 1.0))
                keeper.start()
            elif what == "heal" and pod is not None:  # `pod heal --replace` from another machine
                watch.actor_busy.set()
                try:
                    _quiet(api.world.create, same_as(pod))
                    time.sleep(0.5)
                    _quiet(api.world.vanish, pod.id)
                    time.sleep(twin_s)  # the keeper's next polls see the old one gone and adopt the new one
                finally:
                    watch.actor_busy.clear()
            elif what == "second" and second.proc is None:
                second_until = time.monotonic() + rng.uniform(3.0, 10.0)
                second.start()
            elif pod is not None:
                api.world.emit(pod.id, f"step {rng.randint(1, 10**6)} loss {rng.random():.4f}")
            if pod is not None or what in ("fault", "gpu0", "kill", "second"):
                acted[what] += 1  # drawn and done (a pod event needs a running pod: drawn without one, it is not)
        soak_s = time.monotonic() - started
        second.stop()
        with api._lock:
            api.faults.clear()
        api.world.gpus_on_start = None
        keeper.check()
        mark = time.time()
        target = wait_until(lambda: _settled(api, state, mark), 120, "the keeper's pod running its job again")
        api.world.emit(target, "podguard train: END success exit 0 after 1 attempt(s): job finished")
        deadline = time.monotonic() + 60
        while keeper.proc is not None and keeper.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        final = keeper.proc.poll() if keeper.proc is not None else None
        time.sleep(1.0)
        watch.halt.set()
        billing = [p.id for p in _live(api) if p.status in BILLING]
        return {
            "seed": seed,
            "events": sum(done.values()),
            "by_kind": dict(done),
            "acted_by_kind": dict(acted),
            "soak_s": round(soak_s, 1),
            "final_exit": final,
            "duplicates": len(watch.duplicates),
            "max_live_pods": watch.max_live,
            "pods_left_billing": len(billing),
            "keeper_kills": keeper.kills,
            "keeper_exits_restarted": dict(keeper.exits),
            "requests": len(api.requests),
            "creates": len(api.calls("POST", r"^/v2/pods$")),
            "log": str(work / "keeper.log"),
        }
    finally:
        watch.halt.set()
        keeper.stop()
        second.stop()
        api.close()


def _settled(api: StandIn, state: Path, since: float) -> str | None:
    """The id of the pod the keeper keeps once it runs with its job (a PASS on it, the state fresh), else None."""
    try:
        target = json.loads((state / "keep" / f"{NAME}.json").read_text()).get("target_id")
    except (OSError, ValueError):
        return None
    # its job runs: a PASS on that pod (a keeper started again after the PASS resumes its stream past it, so the
    # PASS may be older than `since`), and a keeper process that wrote its state after `since`
    try:
        fresh = (state / "keep" / f"{NAME}.json").stat().st_mtime >= since
    except OSError:
        fresh = False
    passed = fresh and any(
        e["event"] == "verdict" and "PASS" in e["text"] and e.get("target") == target for e in _events(state)
    )
    live = {p.id: p for p in _live(api)}
    if not passed or target not in live or live[target].status != "RUNNING":
        # a pod kept before the faults stopped may need a nudge: a healthy job prints, a stopped pod is started
        return None
    return target


def _quiet(action: Callable[..., object], *args: object) -> None:
    try:
        action(*args)
    except Exception:  # the pod changed under the driver (terminated meanwhile): nothing to do
        return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--max-s", type=float, default=420.0, help="the soak's time bound (seconds)")
    parser.add_argument("--twin-s", type=float, default=2.0, help="two pods of the name longer than this: a duplicate")
    parser.add_argument("--work", type=Path, help="an empty folder to keep the keeper's log and state in")
    args = parser.parse_args()
    compile_bytecode()
    if args.work is not None:
        args.work.mkdir(parents=True)
        result = soak(args.seed, args.events, args.max_s, args.twin_s, args.work)
    else:
        with tempfile.TemporaryDirectory(prefix="podguard-bench-soak-") as tmp:
            result = soak(args.seed, args.events, args.max_s, args.twin_s, Path(tmp))
            result.pop("log")
    print(json.dumps(result, indent=2))
    ok = result["duplicates"] == 0 and result["pods_left_billing"] == 0 and result["final_exit"] == 0
    print(f"seed {args.seed}: duplicates {result['duplicates']}, pods left billing {result['pods_left_billing']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

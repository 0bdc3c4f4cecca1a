"""`pod keep` soak against the test suite's stand-in RunPod: a seeded, randomized night of faults.

A real keeper process (`podguard pod keep`, fast knobs) keeps one pod while a seeded random driver, for a few
hundred events (bounded in time), does what real nights do:
- faults on every request kind the keeper sends: the listing (its one status request a poll), a pod's read-back, the
  create, the actions (start, stop), the terminate (a DELETE), the log stream, the keep's record (a template); as an
  HTML 502, a 500, a 429, a dropped connection, a "lost" answer (done, then the connection dropped), a slow answer
  (0.2 s: 40 % of the soak's 0.5 s poll, as a slow RunPod answer is a sliver of a 30 s one), and a "late" one (the
  connection dropped at once, the create or start landing 0.3 to 2 s later); 1 to 4 in a row (some outlast
  --retry-for);
- what RunPod does to the pod: a stop for maintenance (END signal, then EXITED), ERROR, a vanished pod, a lost host
  (RUNNING, no runtime, silent), a preflight that fails, a resume with zero GPUs, a status the spec does not list
  (RESTARTING) or none at all, for a moment;
- SIGKILL of the keeper at random points, started again after a moment (as RunPod restarts a keeper pod);
- other actors: `pod heal --replace` from another machine (an identical pod of the name, podguard's mark copied,
  then the old one terminated), a second `pod keep` on this machine under another HOME and state dir (refused: one
  keeper of a name per machine), a keep from another machine (a new keep: refused while the stranger below is
  there; otherwise it takes over, and the first keeper yields at its next action), and `pod down` at a random
  moment (the keeper is started again only after the check below: a new keep, once the stranger's owner took it
  away; a new stranger is planted once that keep runs);
- a stranger: a pod of the name without podguard's mark (someone's notebook), planted once the keep runs.
At the end the faults stop, the job prints `END success`, and the keeper must stop the pod and exit 0.

Invariants, each a figure: duplicates (two marked pods of the name billing, RUNNING/STARTING/PROVISIONING, at the
same time for longer than 3 polls while a keeper watches: not while it is killed and starting again), pods left
billing (after the keeper ended), billing after `pod down` (a pod of the name billing at any moment from `pod
down`'s return to --after-down-s later), and the stranger touched (any action, terminate or change of its status).
Also: keeper exits other than the final one (each restarted, as RunPod would), the requests made.

Run: `python bench/bench_keep_soak.py [--seed 7] [--events 300] [--max-s 420] [--after-down-s 20]`
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
from standin_state import PodRecord, Timing, same_as  # same_as copies the env: podguard's mark too

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
POLL_S = 0.5  # --poll: requests take milliseconds against it, as on RunPod against 30 s
KNOBS = {
    "PODGUARD_KEEP_LAND_S": "2.5",  # a late create lands within 2 s of its lost answer here
    "PODGUARD_KEEP_CONFIRM_S": "3",
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
    ("GET", r"^/v2/pods/[^/]+$"),  # a read-back
    ("GET", r"^/v2/pods$"),  # the listing: one a poll
    ("POST", r"^/v2/pods$"),
    ("POST", r"/action$"),
    ("DELETE", r"^/v2/pods/[^/]+$"),  # terminate (REST v2: DELETE /v2/pods/{id}): surplus pods, replacements
    ("GET", r"/logs$"),
    ("GET", r"^/v2/templates"),  # the keep's record, read before every action
]
FAULTS = ("html502", "500", "429", "drop", "lost", "slow")
LATE = (("POST", r"^/v2/pods$"), ("POST", r"/action$"))  # what may land after its answer was lost
BILLING = ("RUNNING", "STARTING", "PROVISIONING")
STRANGER_IMAGE = "jupyter/scipy-notebook:2024"
STARTUP_S = 1.5  # a keeper (re)started: its imports and its first listing, before it can converge anything


class KeeperProc:
    """One `pod keep` process at a time, started again whenever it ends (as RunPod restarts a keeper pod)."""

    def __init__(self, spec: Path, env: dict[str, str], log: Path) -> None:
        self.spec, self.env, self.log = spec, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: Counter[int] = Counter()
        self.kills = 0
        self.paused = False  # after `pod down`: not started again until the check is over
        self.started = 0.0  # time.monotonic() of the latest start
        self.refusals_end = False  # a keep refused (64: one keeper per machine, a stranger of the name) stays ended

    def start(self) -> None:
        args = [*PODGUARD, "pod", "keep", "--spec", str(self.spec), "--poll", f"{POLL_S:g}", "--retry-for", "0.3"]
        args += ["--max-recoveries", "100000"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        self.started = time.monotonic()

    def watching(self, grace_s: float) -> bool:
        """Its process runs and has been up for `grace_s` (its start-up: imports, the first listing)."""
        return self.proc is not None and self.proc.poll() is None and time.monotonic() - self.started >= grace_s

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self.exits[self.proc.returncode] += 1
            if self.proc.returncode == 64 and self.refusals_end:
                self.paused = True
            self.proc = None
        if self.proc is None and not self.paused:
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


def _marked(pod: PodRecord) -> bool:
    return pod.env.get("PODGUARD_MARK", "").startswith("podguard/1 ")


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
    """Samples the pods of the name every 20 ms: duplicate episodes (two marked pods billing at once for longer
    than twin_s while the keeper watches: not while it is killed and starting again, when nothing can converge),
    billing while `pod down`'s check runs, and any change to the stranger."""

    def __init__(self, api: StandIn, twin_s: float, keeper: KeeperProc | None = None) -> None:
        super().__init__(daemon=True)
        self.api, self.twin_s, self.keeper = api, twin_s, keeper
        self.halt = threading.Event()
        self.duplicates: list[tuple[str, ...]] = []
        self.longest_twin_s = 0.0
        self.max_live = 0
        self.after_down = threading.Event()  # set from `pod down`'s return until the check is over
        self.billing_after_down: set[str] = set()
        self.stranger: PodRecord | None = None  # the one watched now
        self.strangers: list[str] = []  # every one planted: no request of podguard's may name one
        self.stranger_status = ""
        self.stranger_changed = False

    def run(self) -> None:
        since: dict[tuple[str, ...], float] = {}
        while not self.halt.wait(0.02):
            live = _live(self.api)
            mine = [p for p in live if _marked(p)]
            billing = tuple(sorted(p.id for p in mine if p.status in BILLING))
            self.max_live = max(self.max_live, len(mine))
            if self.after_down.is_set():
                self.billing_after_down.update(p.id for p in live if p.status in BILLING and p is not self.stranger)
            if self.stranger is not None and self.stranger.status != self.stranger_status:
                self.stranger_changed = True
            if len(billing) < 2 or (self.keeper is not None and not self.keeper.watching(STARTUP_S)):
                since.clear()
                continue
            first = since.setdefault(billing, time.monotonic())
            self.longest_twin_s = max(self.longest_twin_s, time.monotonic() - first)
            if time.monotonic() - first > self.twin_s and billing not in self.duplicates:
                self.duplicates.append(billing)


def soak(
    seed: int,
    events: int,
    max_s: float,
    twin_s: float,
    work: Path,
    after_down_s: float = 20.0,
    must: tuple[str, ...] = (),
) -> dict[str, object]:
    """One seeded soak (see the module docstring); `must`: events drawn first, once each, in a seeded order."""
    rng = random.Random(seed)
    first = list(must)
    rng.shuffle(first)
    api = StandIn(KEY, Timing(provision_s=0.3, start_s=0.2, verdict_delay_s=0.1, keepalive_s=0.5)).start()
    api._server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a killed keeper's broken pipes
    api.world.set_capacity("NVIDIA A40", 100_000)
    api.world.set_capacity("NVIDIA RTX A6000", 10)
    home, state = work / "home", work / "state"
    home.mkdir()
    (work / "home2").mkdir()
    spec = work / "soak.toml"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODGUARD_")}
    env.update(RUNPOD_API_BASE_URL=api.url, RUNPOD_API_KEY=KEY, HOME=str(home), PODGUARD_STATE_DIR=str(state))
    env.update(KNOBS, PODGUARD_KEEPERS_DIR=str(work / "keepers"))
    keeper = KeeperProc(spec, env, work / "keeper.log")
    here = {**env, "HOME": str(work / "home2"), "PODGUARD_STATE_DIR": str(work / "state2")}
    second = KeeperProc(spec, here, work / "second.log")  # this machine, another HOME: refused
    there = {**env, "PODGUARD_STATE_DIR": str(work / "state3"), "PODGUARD_KEEPERS_DIR": str(work / "keepers3")}
    elsewhere = KeeperProc(spec, there, work / "elsewhere.log")  # another machine: takes over for a while
    second.paused = elsewhere.paused = True
    elsewhere.refusals_end = True
    watch = Watch(api, twin_s, keeper)
    done: Counter[str] = Counter()
    acted: Counter[str] = Counter()
    downs: list[float] = []
    started = time.monotonic()
    try:
        keeper.start()
        watch.start()
        wait_until(
            lambda: any(e["event"] == "verdict" and "PASS" in e["text"] for e in _events(state)), 60, "first PASS"
        )
        _plant_stranger(api, watch)
        elsewhere_until = 0.0
        while sum(done.values()) < events and time.monotonic() - started < max_s:
            time.sleep(rng.uniform(0.15, 0.6))
            keeper.check()
            second.check()
            if elsewhere.proc is not None and time.monotonic() > elsewhere_until:
                elsewhere.stop()
                elsewhere.proc, elsewhere.paused = None, True
            elsewhere.check()
            what = first.pop(0) if first else rng.choices(
                ["fault", "late", "maintenance", "error", "vanish", "lose_host", "unhealthy", "gpu0", "odd", "kill",
                 "heal", "second", "elsewhere", "down", "noise"],
                weights=[26, 6, 8, 6, 4, 3, 3, 2, 4, 10, 3, 2, 2, 1, 20],
            )[0]  # fmt: skip
            done[what] += 1
            live = [p for p in _live(api) if _marked(p) and p.status == "RUNNING" and not p.host_lost]
            pod = rng.choice(live) if live else None
            if what == "fault":
                method, path = rng.choice(ROUTES)
                kind = rng.choice(FAULTS)
                api.fault(method, path, kind, times=rng.randint(1, 4), delay=0.2)  # slow: 0.2 s, 40 % of a poll
            elif what == "late":  # a create or start whose answer is lost lands a moment later
                method, path = rng.choice(LATE)
                api.fault(method, path, "late", times=1, delay=rng.uniform(0.3, 2.0))
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
            elif what == "odd" and pod is not None:  # RESTARTING, or no status at all, for a moment
                _quiet(api.world.odd_status, pod.id, rng.choice(["RESTARTING", None]), rng.uniform(0.3, 2.0))
            elif what == "kill":
                keeper.kill()
                time.sleep(rng.uniform(0.05, 1.0))
                keeper.check()
            elif what == "heal" and pod is not None:  # `pod heal --replace` from another machine: the mark is copied
                _quiet(api.world.create, same_as(pod))
                time.sleep(0.5)
                _quiet(api.world.vanish, pod.id)
            elif what == "second" and second.proc is None:  # this machine, another HOME: one keeper per machine
                second.paused = False
                second.start()
                second.paused = True
            elif what == "elsewhere" and elsewhere.proc is None:
                elsewhere_until = time.monotonic() + rng.uniform(3.0, 10.0)
                elsewhere.paused = False
                elsewhere.start()
            elif what == "down":
                if elsewhere.proc is not None:  # another machine's keeper is ended there first (its leases are there)
                    elsewhere.paused = True
                    elsewhere.stop()
                    elsewhere.check()
                took, restarted = _down(api, keeper, watch, env, work, after_down_s)
                downs.append(took)
                wait_until(lambda t0=restarted: _passed_since(state, t0), 60, "the new keep's PASS")  # no stranger yet
                _plant_stranger(api, watch)
            elif pod is not None:
                api.world.emit(pod.id, f"step {rng.randint(1, 10**6)} loss {rng.random():.4f}")
            if pod is not None or what in ("fault", "late", "gpu0", "kill", "second", "elsewhere", "down"):
                acted[what] += 1  # drawn and done (a pod event needs a running pod: drawn without one, it is not)
        soak_s = time.monotonic() - started
        elsewhere.paused = True
        elsewhere.stop()
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
        billing = [p for p in _live(api) if p.status in BILLING and p is not watch.stranger]
        left = [f"{p.id} {p.status} {'marked' if _marked(p) else 'unmarked'} {p.image}" for p in billing]
        stranger_touched = watch.stranger_changed or any(s in r.path for r in api.requests for s in watch.strangers)
        return {
            "seed": seed,
            "events": sum(done.values()),
            "by_kind": dict(done),
            "acted_by_kind": dict(acted),
            "soak_s": round(soak_s, 1),
            "final_exit": final,
            "duplicates": len(watch.duplicates),
            "duplicate_pods": [list(d) for d in watch.duplicates],
            "longest_twin_s": round(watch.longest_twin_s, 2),
            "max_marked_pods": watch.max_live,
            "pods_left_billing": len(billing),
            "left_billing": left,
            "downs": len(downs),
            "down_to_nothing_billing_s": [round(d, 2) for d in downs],
            "billing_after_down": len(watch.billing_after_down),
            "stranger_touched": stranger_touched,
            "keeper_kills": keeper.kills,
            "keeper_exits_restarted": dict(keeper.exits),
            "second_exits": dict(second.exits),
            "elsewhere_exits": dict(elsewhere.exits),
            "late_landed": len(api.landed),
            "requests": len(api.requests),
            "creates": len(api.calls("POST", r"^/v2/pods$")),
            "log": str(work / "keeper.log"),
        }
    finally:
        watch.halt.set()
        keeper.stop()
        second.stop()
        elsewhere.stop()
        api.close()


def _passed_since(state: Path, since: float) -> bool:
    return any(e["event"] == "verdict" and "PASS" in e["text"] and e["t"] > since for e in _events(state))


def _plant_stranger(api: StandIn, watch: Watch) -> None:
    """Someone's notebook of the same name, from now on: never to be touched (watched until its owner ends it)."""
    with api.world.lock:
        pod = api.world.create(
            {"name": NAME, "image": STRANGER_IMAGE, "gpu": {"id": "NVIDIA RTX A6000", "count": 1}, "env": {}}
        )
    wait_until(lambda: pod.status == "RUNNING", 30, "the stranger running")
    watch.stranger_status, watch.stranger = "RUNNING", pod
    watch.strangers.append(pod.id)


def _retire_stranger(api: StandIn, watch: Watch) -> None:
    """Its owner takes the notebook away (the world does, not podguard): watched no more."""
    pod, watch.stranger = watch.stranger, None
    if pod is not None:
        _quiet(api.world.vanish, pod.id)


def _down(
    api: StandIn, keeper: KeeperProc, watch: Watch, env: dict[str, str], work: Path, after_s: float
) -> tuple[float, float]:
    """`pod down` at a random moment: (the time from the command to nothing of the name billing, when the keep was
    started again: a new keep). After it returned, nothing may bill for `after_s`."""
    keeper.paused = True
    began = time.monotonic()
    with (work / "down.log").open("ab") as out:
        subprocess.run([*PODGUARD, "pod", "down", NAME], env=env, stdout=out, stderr=out, timeout=300, check=False)
    returned = time.monotonic()
    while any(p.status in BILLING and p is not watch.stranger for p in _live(api)) and time.monotonic() - returned < 5:
        time.sleep(0.01)
    nothing_billing = time.monotonic() - began
    watch.after_down.set()
    time.sleep(after_s)
    watch.after_down.clear()
    _retire_stranger(api, watch)  # a new keep refuses a stranger of the name (64): its owner ends it first
    keeper.check()  # (it ended: SIGTERM) counted, then started again: a new keep of the name
    keeper.paused = False
    restarted = time.time()
    keeper.check()
    return nothing_billing, restarted


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


def invariants_hold(result: dict[str, object]) -> bool:
    return (
        result["duplicates"] == 0
        and result["pods_left_billing"] == 0
        and result["billing_after_down"] == 0
        and not result["stranger_touched"]
        and result["final_exit"] == 0
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--max-s", type=float, default=420.0, help="the soak's time bound (seconds)")
    parser.add_argument(
        "--twin-s",
        type=float,
        default=3 * POLL_S,
        help="two marked pods billing longer than this (3 polls): a duplicate",
    )
    parser.add_argument("--after-down-s", type=float, default=20.0, help="after `pod down` returned, nothing bills")
    parser.add_argument("--work", type=Path, help="an empty folder to keep the keeper's log and state in")
    args = parser.parse_args()
    compile_bytecode()
    if args.work is not None:
        args.work.mkdir(parents=True)
        result = soak(args.seed, args.events, args.max_s, args.twin_s, args.work, args.after_down_s)
    else:
        with tempfile.TemporaryDirectory(prefix="podguard-bench-soak-") as tmp:
            result = soak(args.seed, args.events, args.max_s, args.twin_s, Path(tmp), args.after_down_s)
            result.pop("log")
    print(json.dumps(result, indent=2))
    ok = invariants_hold(result)
    print(
        f"seed {args.seed}: duplicates {result['duplicates']}, pods left billing {result['pods_left_billing']}, "
        f"billing after down {result['billing_after_down']}, stranger touched {result['stranger_touched']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

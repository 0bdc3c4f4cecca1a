"""`pod down` of a kept pod against the test suite's stand-in RunPod: the time from the command to nothing of the
name billing, and that nothing bills after it returned.

Three cases, each with the product's own timings (a request's deadline 30 s, PODGUARD_KEEP_LAND_S 30 s) unless
--land-s / --timeout-s say otherwise:
1. idle: a laptop keeper watches a running pod; nothing is in flight. `pod down` ends it and takes the pod down.
2. a lost create: the keeper is replacing the pod and its create's answer was lost; RunPod makes the pod
   --late-s later. `pod down` waits for the keeper's lease (the request's deadline + LAND_S), sweeping, and takes
   the late pod down when it lands.
3. a keeper pod: the keep was deployed (`--deploy`); the keeper pod is terminated, and `pod down` sweeps for the
   whole bound (its leases are on its own disk), since it may have sent a create just before it went.
For each: the command's duration (how long it kept sweeping), when nothing of the name billed any more (from the
command's start: the last moment a pod of the name was seen billing), and whether anything billed in --after-s after
it returned.

Run: `python bench/bench_keep_down.py [--late-s 3] [--after-s 10] [--land-s 30] [--timeout-s 30]`
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import PODGUARD, ROOT, compile_bytecode
from bench_keep import wait_until

sys.path.insert(0, str(ROOT / "tests" / "pods"))
from standin_api import StandIn
from standin_state import Timing

KEY = "rpa_DOWNKEY0123456789abcdefghijklmnop"
NAME = "downbench"
SPEC = f"""
name = "{NAME}"
image = "registry.example/me/podguard:0.2"
args = "train -- python train.py"
[gpu]
types = ["NVIDIA A40"]
count = 2
[network_volume]
id = "vol-down"
path = "/workspace"
"""
BILLING = ("RUNNING", "STARTING", "PROVISIONING", "ERROR")


def _billing(api: StandIn) -> list[str]:
    with api.world.lock:
        return [p.id for p in api.world.pods.values() if p.name == NAME and p.status in BILLING]


def _passes(state: Path) -> int:
    path = state / "keep" / f"{NAME}.events.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"verdict"' in line and "PASS" in line)


def one(case: str, work: Path, *, late_s: float, after_s: float, knobs: dict[str, str]) -> dict[str, object]:
    api = StandIn(KEY, Timing(provision_s=0.3, start_s=0.2, verdict_delay_s=0.1)).start()
    api._server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a killed keeper's broken pipes
    api.world.set_capacity("NVIDIA A40", 1000)
    home, state = work / f"home-{case}", work / f"state-{case}"
    home.mkdir()
    spec = work / f"{case}.toml"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODGUARD_")}
    env.update(RUNPOD_API_BASE_URL=api.url, RUNPOD_API_KEY=KEY, HOME=str(home), PODGUARD_STATE_DIR=str(state))
    env.update(knobs, PODGUARD_KEEPERS_DIR=str(work / f"keepers-{case}"), PODGUARD_KEEP_SETTLE_S="0.2")
    env.update(PODGUARD_KEEP_RECOVERY_POLL_S="0.2", PODGUARD_POD_POLL_S="0.2")
    keeper = None
    try:
        args = [*PODGUARD, "pod", "keep", "--spec", str(spec), "--poll", "0.5"]
        if case == "keeper-pod":
            deployed = subprocess.run([*args, "--deploy", "--json"], env=env, capture_output=True, text=True)
            pod_id = json.loads(deployed.stdout)["id"]
            (body,) = [json.loads(c.body) for c in api.calls("POST", r"^/v2/pods$") if b"-keeper" in c.body]
            inside = {k: v for k, v in body["env"].items() if k != "RUNPOD_API_KEY"}  # (RunPod fills the secret)
            keeper = subprocess.Popen(
                [*PODGUARD, "pod", "keep"],
                env={**env, **inside, "RUNPOD_POD_ID": pod_id, "PODGUARD_STATE_DIR": str(work / "keeper-pod-disk")},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_until(lambda: _passes(work / "keeper-pod-disk") >= 1, 120, "the keeper pod's first PASS")
        else:
            keeper = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until(lambda: _passes(state) >= 1, 120, "the first PASS")
        if case == "lost-create":
            api.fault("POST", r"^/v2/pods$", "late", delay=late_s)  # the replacement's answer is lost
            with api.world.lock:
                (pod,) = [p for p in api.world.pods.values() if p.name == NAME and p.status == "RUNNING"]
            api.world.set_error(pod.id)
            wait_until(lambda: api.calls("POST", r"^/v2/pods$")[1:], 60, "the replacement's create")
        last = [time.monotonic()]  # the last moment a pod of the name was seen billing
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.01):
                if _billing(api):
                    last[0] = time.monotonic()

        sampler = threading.Thread(target=sample, daemon=True)
        began = time.monotonic()
        sampler.start()
        done = subprocess.run([*PODGUARD, "pod", "down", NAME], env=env, capture_output=True, text=True)
        returned = time.monotonic()
        sampling.set()
        sampler.join()
        if case == "keeper-pod" and keeper is not None:
            keeper.kill()  # (RunPod ends a terminated keeper pod's container)
        nothing = last[0]
        billed_after: set[str] = set()
        until = returned + after_s
        while time.monotonic() < until:
            billed_after.update(_billing(api))
            time.sleep(0.02)
        return {
            "case": case,
            "exit": done.returncode,
            "down_s": round(returned - began, 2),
            "nothing_billing_s": round(max(nothing - began, 0.0), 2),  # from the command to the last pod billing
            "billing_after_return": sorted(billed_after),
            "late_landed": len(api.landed),
            "said_wait": "waiting up to" in done.stderr,
        }
    finally:
        if keeper is not None and keeper.poll() is None:
            keeper.kill()
            keeper.wait()
        api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late-s", type=float, default=3.0, help="the lost create lands this long after it was sent")
    parser.add_argument("--after-s", type=float, default=10.0, help="after `pod down` returned, nothing may bill")
    parser.add_argument("--land-s", type=float, default=30.0, help="PODGUARD_KEEP_LAND_S")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="PODGUARD_API_TIMEOUT_S (a request's deadline)")
    parser.add_argument("--cases", default="idle,lost-create,keeper-pod")
    args = parser.parse_args()
    compile_bytecode()
    knobs = {"PODGUARD_KEEP_LAND_S": f"{args.land_s:g}", "PODGUARD_API_TIMEOUT_S": f"{args.timeout_s:g}"}
    ok = True
    with tempfile.TemporaryDirectory(prefix="podguard-bench-down-") as tmp:
        for case in args.cases.split(","):
            result = one(case, Path(tmp), late_s=args.late_s, after_s=args.after_s, knobs=knobs)
            ok = ok and result["exit"] == 0 and not result["billing_after_return"]
            print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Driving `podguard pod keep` as a real process against the stand-in: fast knobs, waits, the pod's own lines.

    proc = keep(spec)                                  # `podguard pod keep --spec SPEC --poll 0.1` in the background
    wait_event(tmp_path, "verdict")                    # its record in the state dir says what it saw
    say_end(standin.world, live_pod(standin.world), "success", 0)   # the END line podguard prints in the pod
    code, out, err = finish(proc)

A test plays RunPod and the job: it writes the pod's lines (`World.emit`), stops it, loses its host, puts it in
ERROR; the keeper is the real CLI, over real HTTP and SSE, with `--poll 0.1` and the 15-minute silence at 1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pods_support import A40_SPEC, KEY, PODGUARD, SPAWNED
from standin_state import PodRecord, World

from loadfactor import scaled

KEEP_FAST = {
    "PODGUARD_KEEP_SILENCE_S": "1",
    "PODGUARD_KEEP_SETTLE_S": "0.3",
    "PODGUARD_KEEP_RECOVERY_POLL_S": "0.1",
    "PODGUARD_KEEP_CAPACITY_WAIT_S": "0.3",
    "PODGUARD_KEEP_CAPACITY_WAIT_CAP_S": "0.6",
}
POLL = "0.1"
CLUSTER_SPEC = """
    name = "ring"
    image = "registry.example/me/podguard:0.2"
    args = "train --mode torchrun -- python train.py"

    [gpu]
    types = ["NVIDIA A40"]
    count = 2

    [cluster]
    nodes = 2

    [network_volume]
    id = "vol-9"
    path = "/workspace"
"""  # a 2-node Instant Cluster with a network volume


def keep(spec: Path, *args: str, env: dict[str, str] | None = None, poll: str = POLL) -> subprocess.Popen[str]:
    """`podguard pod keep --spec SPEC --poll POLL ARGS` in the background, as a user starts it."""
    proc = subprocess.Popen(
        [*PODGUARD, "pod", "keep", "--spec", str(spec), "--poll", poll, *args],
        env={**os.environ, **KEEP_FAST, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    SPAWNED.append(proc)
    return proc


def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[int, str, str]:
    timeout = scaled(timeout)  # a deadline, not what the test checks: a busy machine's keeper ends later
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"pod keep did not end within {timeout}s\n{err}") from None
    return proc.returncode, out, err


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or check}")


def events(tmp_path: Path, name: str = "trainer") -> list[dict[str, Any]]:
    path = tmp_path / "state" / "keep" / f"{name}.events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_event(
    tmp_path: Path, kind: str, count: int = 1, *, text: str = "", timeout: float = 20.0, name: str = "trainer"
) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]]:
        hits = [e for e in events(tmp_path, name) if e["event"] == kind and text in e["text"]]
        return hits if len(hits) >= count else []

    return wait_for(found, timeout, f"{count} {kind!r} event(s) {text!r}")


def passes(tmp_path: Path, count: int = 1, name: str = "trainer") -> list[dict[str, Any]]:
    return wait_event(tmp_path, "verdict", count, text="PASS", name=name)


def live_pods(world: World, name: str = "trainer") -> list[PodRecord]:
    with world.lock:
        return [p for p in world.pods.values() if p.name == name and p.status != "TERMINATED"]


def live_pod(world: World, name: str = "trainer") -> PodRecord:
    (pod,) = live_pods(world, name)
    return pod


def say_end(world: World, pod: PodRecord, kind: str, code: int, attempts: int = 1, detail: str = "") -> None:
    """The END line podguard prints in the pod (outcome_lines.py)."""
    tail = f": {detail}" if detail else ""
    world.emit(pod.id, f"podguard train: END {kind} exit {code} after {attempts} attempt(s){tail}")


def maintenance(world: World, pod: PodRecord) -> None:
    """RunPod stops the pod: its SIGTERM ends the job (END signal), then the pod is EXITED."""
    say_end(world, pod, "signal", 143, detail="received SIGTERM")
    time.sleep(0.05)
    world.act(pod.id, "stop")


def inside_keeper(standin: Any, spec: Path, extra_env: dict[str, str], *, popen: bool = False) -> tuple[str, Any]:
    """Deploy a keeper pod, then run `pod keep` the way its container would (RunPod filled in the key secret):
    (keeper pod id, the finished process, or the running one with `popen`)."""
    from pods_support import pg

    deployed = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--json"])
    assert deployed.returncode == 0, deployed.stderr
    keeper_id = json.loads(deployed.stdout)["id"]
    (body,) = [json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$") if b"-keeper" in c.body]
    env = {k: v for k, v in body["env"].items() if k != "RUNPOD_API_KEY"}
    env["RUNPOD_POD_ID"] = keeper_id
    full = {**os.environ, **KEEP_FAST, **env, "PODGUARD_POLL": POLL, **extra_env}
    args = [*PODGUARD, "pod", "keep"]
    if popen:
        proc = subprocess.Popen(args, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        SPAWNED.append(proc)
        return keeper_id, proc
    return keeper_id, subprocess.run(args, env=full, capture_output=True, text=True, timeout=60)


def state(tmp_path: Path, name: str = "trainer") -> dict[str, Any]:
    return json.loads((tmp_path / "state" / "keep" / f"{name}.json").read_text())


def assert_no_key(standin: Any, tmp_path: Path, *texts: str) -> None:
    """The API key never leaves the Authorization header: not in a target, a body, an output or a state file."""
    for rec in standin.requests:
        assert KEY not in rec.target and KEY.encode() not in rec.body
    for text in texts:
        assert KEY not in text
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


def intent(standin: Any, name: str = "trainer") -> dict[str, Any] | None:
    """The keep's record of `name` as RunPod holds it (the template `podguard-intent-<name>`), or None."""
    with standin.world.lock:
        found = [t for t in standin.world.templates.values() if t.get("name") == f"podguard-intent-{name}"]
    if not found:
        return None
    assert len(found) == 1, found
    return json.loads(found[0]["env"]["PODGUARD_INTENT"])


def billing(world: World, name: str = "trainer") -> list[PodRecord]:
    """The pods of `name` that bill now (RUNNING, STARTING, PROVISIONING, ERROR: RunPod charges until a stop)."""
    return [p for p in live_pods(world, name) if p.status in ("RUNNING", "STARTING", "PROVISIONING", "ERROR")]


def marked(world: World, pod: PodRecord, **changes: Any) -> dict[str, Any]:
    """A create body like `pod`, with its env (podguard's mark included): another podguard actor's twin."""
    from standin_state import same_as

    return {**same_as(pod), **changes}


# The kept pod's spec with a network volume (the keeper's usual case); tests/pods/conftest.py writes it as `spec`.
NETWORK = A40_SPEC.replace("[env]", '[network_volume]\nid = "vol-1"\npath = "/workspace"\n\n[env]')

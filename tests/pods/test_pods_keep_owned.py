"""What is podguard's to touch (issue 29): a stranger's pod of the name, a kind change, a user's own `<name>-keeper`,
a pid that is not a keeper, a spec edited between keeper runs, two pods of the name at a fresh start, a keeper pod
that is lost, a spec with a checkpoint store. The real CLI as a process against the stand-in RunPod.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from keep_support import (
    CLUSTER_SPEC,
    billing,
    finish,
    keep,
    live_pod,
    live_pods,
    marked,
    passes,
    say_end,
    wait_event,
    wait_for,
)
from pods_support import A40_SPEC, pg, standin, write_spec  # noqa: F401 (fixture)

STORE = A40_SPEC.replace(
    "[env]", '[checkpoints]\ndir = "/workspace/ckpt"\nstore = "s3://my-bucket/trainer"\n\n[env]'
).replace('ports = ["22/tcp", "8888/http"]', 'ports = ["22/tcp", "8888/http"]\ndata_centers = ["US-KS-2", "US-TX-3"]')


def creates(standin, name: str = "trainer") -> list[dict]:  # noqa: F811
    return [b for b in (json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$")) if b["name"] == name]


def actions(standin, pod_id: str = "") -> list[str]:  # noqa: F811
    return [json.loads(c.body)["action"] for c in standin.calls("POST", rf"{pod_id}/action$")]


def notebook(world, name: str = "trainer", *, cpu: bool = False):
    """Someone's own pod of the name: another image, no podguard mark (a notebook that shares the name)."""
    compute = {"cpu": {"id": "cpu3c", "vcpuCount": 2}} if cpu else {"gpu": {"id": "NVIDIA RTX A6000", "count": 1}}
    body = {"name": name, "image": "jupyter/scipy-notebook:2024", "mounts": {}, **compute}
    if not cpu:
        world.set_capacity("NVIDIA RTX A6000", 4)
    return world.create(body)


# -- 5. a stranger's pod is never adopted, started or terminated -----------------------------------------------------
def test_a_stopped_stranger_of_the_name_is_refused_naming_it_and_left_as_it_is(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    theirs = notebook(world)
    wait_for(lambda: theirs.status == "RUNNING", what="the notebook running")
    world.act(theirs.id, "stop")
    proc = pg(["pod", "keep", "--spec", str(spec)])
    assert proc.returncode == 64, proc.stderr
    assert theirs.id in proc.stderr and "jupyter/scipy-notebook:2024" in proc.stderr and "EXITED" in proc.stderr
    assert f"--adopt {theirs.id}" in proc.stderr
    up = pg(["pod", "up", "--spec", str(spec)])
    assert up.returncode == 64 and theirs.id in up.stderr
    assert theirs.status == "EXITED" and actions(standin, theirs.id) == [] and creates(standin) == []


def test_a_stranger_that_appears_during_a_keep_is_never_touched(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    mine = live_pod(world)
    theirs = notebook(world)  # someone starts a notebook of the same name
    wait_event(tmp_path, "stranger")
    world.set_error(mine.id)  # the keeper's pod breaks: replaced by a new one of its own, never by the notebook
    passes(tmp_path, 2)
    wait_for(lambda: mine.status == "TERMINATED", what="the broken pod terminated")
    (new,) = [p for p in live_pods(world) if p.id != theirs.id]
    say_end(world, new, "success", 0)
    assert finish(proc)[0] == 0
    assert theirs.status == "RUNNING" and actions(standin, theirs.id) == []
    assert not standin.calls("DELETE", rf"/{theirs.id}$")


def test_adopt_hands_a_pod_made_without_the_mark_to_the_keep(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    old = world.create(  # made by a podguard from before the mark: no PODGUARD_MARK in its env
        {
            "name": "trainer",
            "image": "registry.example/me/podguard:0.2",
            "args": "train -- python train.py",
            "gpu": {"id": "NVIDIA A40", "count": 2},
            "mounts": {"network": [{"volumeId": "vol-1", "path": "/workspace"}]},
        }
    )
    assert pg(["pod", "keep", "--spec", str(spec)]).returncode == 64  # not podguard's, until handed over
    proc = keep(spec, "--adopt", old.id)
    passes(tmp_path)
    assert live_pods(world) == [old] and creates(standin) == []
    say_end(world, old, "success", 0)
    assert finish(proc)[0] == 0 and old.status == "EXITED"


# -- 6. a kind change while the other kind exists --------------------------------------------------------------------
def test_a_kind_change_is_refused_naming_what_exists_and_down_takes_down_both_kinds(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    assert pg(["pod", "up", "--spec", str(spec)]).returncode == 0
    pod = live_pod(world)
    cluster_spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC.replace('name = "ring"', 'name = "trainer"'))
    refused = pg(["pod", "keep", "--spec", str(cluster_spec)])
    assert refused.returncode == 64 and pod.id in refused.stderr and "makes a cluster" in refused.stderr
    assert world.clusters == {}
    cluster = world.create_cluster(  # a cluster of the name made by podguard (e.g. an older keep of the cluster spec)
        {
            "name": "trainer",
            "type": "TRAINING",
            "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 2, "podCount": 2},
            "image": "registry.example/me/podguard:0.2",
            "env": dict(pod.env),
        }
    )
    down = pg(["pod", "down", "trainer"])
    assert down.returncode == 0, down.stderr
    assert pod.status == "TERMINATED" and world.clusters == {}, down.stderr
    assert all(world.pods[m].status == "TERMINATED" for m in cluster.members)


# -- 9. `pod stop NAME` never touches a user's own `NAME-keeper` -----------------------------------------------------
def test_pod_stop_and_down_never_touch_a_users_own_pod_named_like_the_keeper(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    theirs = notebook(world, "trainer-keeper", cpu=True)
    proc = keep(spec)
    passes(tmp_path)
    stop = pg(["pod", "stop", "trainer"])
    assert stop.returncode == 0, stop.stderr
    assert finish(proc)[0] == 128 + signal.SIGTERM
    assert "not podguard's keeper of trainer" in stop.stderr
    assert pg(["pod", "down", "trainer"]).returncode == 0
    assert theirs.status == "RUNNING" and not standin.calls("DELETE", rf"/{theirs.id}$")


# -- 11. a pid is signalled only while it is proven to be a keeper of the name ---------------------------------------
def test_pod_down_never_signals_a_pid_that_is_not_a_keeper(standin, spec, tmp_path):  # noqa: F811
    sleeper = subprocess.Popen(["sleep", "120"])
    keep_dir = tmp_path / "state" / "keep"
    keep_dir.mkdir(parents=True)
    (keep_dir / "trainer.json").write_text(json.dumps({"name": "trainer", "kind": "pod", "pid": sleeper.pid}))
    holder = subprocess.Popen(  # something holds the state dir's lock (another tool, a stale copy)
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(keep_dir / "trainer.lock")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    registry = tmp_path / "keepers" / str(os.getuid())
    registry.mkdir(parents=True)
    (registry / f"trainer.{sleeper.pid}.json").write_text(json.dumps({"name": "trainer", "lease_until": 0}))
    try:
        down = pg(["pod", "down", "trainer"])
        assert down.returncode == 0, down.stderr
        time.sleep(0.3)
        assert sleeper.poll() is None, down.stderr  # an unrelated process: never signalled
    finally:
        sleeper.kill()
        holder.kill()


# -- 12. a spec edited between keeper runs is named, not a host fault ------------------------------------------------
def test_an_edited_gpu_count_is_named_and_never_read_as_a_host_fault(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    spec.write_text(spec.read_text().replace("count = 2", "count = 4"))
    again = keep(spec)
    (said,) = wait_event(tmp_path, "spec")
    assert "GPU count 2 -> 4" in said["text"] and "next replacement" in said["text"]
    time.sleep(1.0)  # several polls: the healthy pod is not replaced
    assert live_pods(world) == [pod] and len(creates(standin)) == 1
    say_end(world, pod, "success", 0)
    assert finish(again)[0] == 0


# -- 15. a fresh keeper that finds two pods of the name converges ----------------------------------------------------
def test_a_fresh_keeper_that_finds_two_of_its_own_converges_on_one(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    assert pg(["pod", "up", "--spec", str(spec)]).returncode == 0
    first = live_pod(world)
    twin = world.create(marked(world, first))  # a twin of podguard's own (a create that landed late)
    proc = keep(spec)
    wait_event(tmp_path, "surplus")
    wait_for(lambda: live_pods(world) == [first], what="one pod: the one that runs")
    assert twin.status == "TERMINATED" and proc.poll() is None
    say_end(world, first, "success", 0)
    assert finish(proc)[0] == 0


# -- 16. the keeper is watched: a lost keeper pod is shown, and a laptop keep takes over -----------------------------
def test_a_lost_keeper_pod_is_shown_and_a_laptop_keep_takes_over_from_it(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    deployed = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--json"])
    assert deployed.returncode == 0, deployed.stderr
    keeper = world.pods[json.loads(deployed.stdout)["id"]]
    assert pg(["pod", "up", "--spec", str(spec)]).returncode == 0
    wait_for(lambda: keeper.status == "RUNNING", what="the keeper pod running")
    world.act(keeper.id, "stop")  # its host went: EXITED, nothing keeps the pod
    status = json.loads(pg(["pod", "status", "trainer", "--json"]).stdout)
    assert status["keeper"] == {"name": "trainer-keeper", "id": keeper.id, "status": "EXITED", "alive": False}
    assert status["kept_by"] is None and "LOST" in pg(["pod", "status", "trainer"]).stdout
    proc = keep(spec)
    passes(tmp_path)
    assert keeper.status == "TERMINATED"  # taken over: it cannot act again
    say_end(world, live_pod(world), "success", 0)
    assert finish(proc)[0] == 0


# -- issue 31: with a checkpoint store, a replacement needs no network volume and may go to any data centre ----------
def test_with_a_store_a_lost_pod_is_replaced_in_any_allowed_data_centre(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.set_capacity("NVIDIA A40", 2, dc="US-KS-2")
    world.set_capacity("NVIDIA A40", 0, dc="US-TX-3")
    world.set_capacity("NVIDIA A100 80GB PCIe", 0)
    spec = write_spec(tmp_path / "store.toml", STORE)
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    assert old.env["PODGUARD_CHECKPOINT_STORE"] == "s3://my-bucket/trainer"
    assert old.env["PODGUARD_CHECKPOINTS"] == "/workspace/ckpt" and old.machine.dc == "US-KS-2"
    written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    detail = f"received SIGTERM; newest checkpoint /workspace/ckpt/checkpoint-40 (step 40, written {written})"
    say_end(world, old, "signal", 143, detail=detail)
    with world.lock:  # the old data centre is full now (its 2 GPUs go to someone else); another one has room
        world.capacity[("NVIDIA A40", "US-KS-2")] = -2
        world.capacity[("NVIDIA A40", "US-TX-3")] = 2
        world.set_error(old.id)
    passes(tmp_path, 2)
    (new,) = live_pods(world)
    assert new.machine.dc == "US-TX-3" and not new.mounts  # no network volume, another data centre
    (recovery,) = wait_event(tmp_path, "recovery")
    assert "checkpoint store s3://my-bucket/trainer" in recovery["text"]
    assert "comes back from checkpoint-40 (step 40)" in recovery["text"]
    say_end(world, new, "success", 0)
    assert finish(proc)[0] == 0 and not billing(world)


def test_a_lost_spot_pod_with_a_store_comes_back_on_a_new_spot_pod(standin, tmp_path):  # noqa: F811
    world = standin.world
    spot = STORE.replace("[gpu]", "interruptible = true\nbid_per_gpu = 0.3\n[gpu]")
    spec = write_spec(tmp_path / "spot.toml", spot)
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    assert old.interruptible and old.env["PODGUARD_MARK"].startswith("podguard/1 ")  # made through GraphQL, marked
    world.set_error(old.id)  # the spot pod is lost (outbid, its host reclaimed)
    passes(tmp_path, 2)
    (new,) = live_pods(world)
    assert new.id != old.id and new.interruptible and old.status == "TERMINATED"
    say_end(world, new, "success", 0)
    assert finish(proc)[0] == 0 and not billing(world)


def test_a_strangers_cluster_of_the_name_is_named_as_a_cluster_and_never_touched(standin, tmp_path):  # noqa: F811
    """The keeper's events name a cluster of the name as a cluster (its id and node counts), not as a pod."""
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec)
    passes(tmp_path, 2, name="ring")
    world.set_capacity("NVIDIA A40", 8)
    theirs = world.create_cluster(  # someone's own cluster of the name: its members carry no podguard mark
        {
            "name": "ring",
            "type": "TRAINING",
            "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 2, "podCount": 2},
            "image": "their/trainer:1",
        }
    )
    (said,) = wait_event(tmp_path, "stranger", name="ring")
    assert f"cluster {theirs.id} (0/2 RUNNING" in said["text"], said["text"]
    assert f"pod {theirs.id}" not in said["text"], said["text"]
    mine = next(c for c in world.clusters.values() if c.id != theirs.id)
    for rank in (1, 0):
        say_end(world, world.pods[mine.members[rank]], "success", 0)
    assert finish(proc)[0] == 0
    assert theirs.id in world.clusters and not standin.calls("DELETE", rf"/{theirs.id}$")

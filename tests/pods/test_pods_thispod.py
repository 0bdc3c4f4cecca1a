"""`pods/thispod`: this pod's id, the pod-and-key check, and the one way its billing ends, in-process against the
suite's stand-in RunPod API (real HTTP). The end-to-end callers (a guard, `--on-exit stop-pod`, the park) are in
test_pods_guards.py and test_pods_selfheal.py."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
from pods_support import KEY, standin  # noqa: F401 (fixture)

from podguard import console
from podguard.errors import ExitCode, UsageError
from podguard.pods import thispod
from podguard.pods.thispod.billing import end_billing, request_end
from podguard.pods.thispod.key import in_pod_with_key, require_pod_and_key


def running(world, record) -> None:
    deadline = time.monotonic() + 30
    while record.status != "RUNNING":
        assert time.monotonic() < deadline, "the stand-in's pod never ran"
        time.sleep(0.02)


@pytest.fixture
def cluster(standin):  # noqa: F811
    world = standin.world
    world.set_capacity("NVIDIA A40", 32)
    compute = {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 8, "podCount": 2}
    record = world.create_cluster({"name": "ring", "type": "TRAINING", "image": "i", "compute": compute})
    for member in world.members(record):
        running(world, member)
    return record


def test_the_pod_id_is_read_in_one_place(monkeypatch):
    monkeypatch.setenv("RUNPOD_POD_ID", "  abc123 \n")
    assert thispod.pod_id() == "abc123" and thispod.ENV_POD_ID == "RUNPOD_POD_ID"
    assert thispod.pod_id({}) == "" and thispod.pod_id({"RUNPOD_POD_ID": " "}) == ""


def test_in_a_pod_with_a_key_needs_both(tmp_path):
    home = {"HOME": str(tmp_path)}  # no ~/.runpod/config.toml there
    assert in_pod_with_key({**home, "RUNPOD_POD_ID": "p1", "RUNPOD_API_KEY": KEY}) == "p1"
    assert in_pod_with_key({**home, "RUNPOD_POD_ID": "p1"}) is None
    assert in_pod_with_key({**home, "RUNPOD_API_KEY": KEY}) is None


def test_an_option_that_acts_on_this_pod_is_64_naming_what_is_missing(tmp_path):
    home = {"HOME": str(tmp_path)}
    with pytest.raises(UsageError) as outside:
        require_pod_and_key("--on-exit=stop-pod", hint="; use exit or idle", env=home)
    assert outside.value.code == ExitCode.USAGE
    assert (
        outside.value.message
        == "--on-exit=stop-pod needs RUNPOD_POD_ID (RunPod sets it inside a pod); use exit or idle"
    )
    with pytest.raises(UsageError) as no_key:
        require_pod_and_key("--max-cost", hint="", env={**home, "RUNPOD_POD_ID": "p1"})
    assert no_key.value.message.startswith("--max-cost needs the RunPod API key: ")
    env = {**home, "RUNPOD_POD_ID": "p1", "RUNPOD_API_KEY": KEY}
    assert require_pod_and_key("--max-cost", hint="", env=env) == "p1"


def test_a_pod_is_stopped(standin):  # noqa: F811
    record = standin.world.create({"name": "solo", "image": "i", "gpu": {"id": "NVIDIA A40", "count": 1}})
    running(standin.world, record)
    with console.captured() as said:
        ended = request_end(record.id, "job succeeded", by="--on-exit stop-pod")
    assert (ended.asked, ended.cluster_id) == ("stop", None)
    assert said == [f"podguard: job succeeded: stopping pod {record.id} (--on-exit stop-pod)"]
    posts = standin.calls("POST", rf"^/v2/pods/{record.id}/action$")
    assert [json.loads(c.body)["action"] for c in posts] == ["stop"] and record.status == "EXITED"


def test_a_cluster_node_deletes_its_cluster_and_never_asks_a_member_stop(standin, cluster):  # noqa: F811
    node1 = next(p for p in standin.world.members(cluster) if p.rank == 1)
    with console.captured() as said:
        ended = request_end(node1.id, "billing guard --max-runtime: ...")
    assert (ended.asked, ended.cluster_id) == ("cluster delete", cluster.id)
    assert said == [
        f"podguard: billing guard --max-runtime: ...: this pod ({node1.id}) is node1 of Instant Cluster {cluster.id}, "
        "whose pods cannot be stopped: deleting the whole cluster, all its nodes (network volumes stay; billing ends)"
    ]
    assert standin.calls("POST", r"/action$") == [] and cluster.id not in standin.world.clusters


def test_a_refused_delete_is_one_warning_and_names_the_cluster(standin, cluster):  # noqa: F811
    standin.fault("DELETE", r"^/v2/clusters/", "403")
    node0 = next(p for p in standin.world.members(cluster) if p.rank == 0)
    with console.captured() as said:
        ended = request_end(node0.id, "job succeeded", by="--on-exit stop-pod")
    assert (ended.asked, ended.cluster_id, ended.pod_id) == (None, cluster.id, node0.id)
    assert len(said) == 1 and said[0].startswith(f"podguard: warning: could not delete cluster {cluster.id}")
    assert KEY not in said[0] and cluster.id in standin.world.clusters


def test_end_billing_holds_the_signal_that_follows_the_request_at_once(standin, monkeypatch):  # noqa: F811
    """RunPod's SIGTERM may come before podguard is back from the request: it is held, not lost, and returned."""
    record = standin.world.create({"name": "solo", "image": "i", "gpu": {"id": "NVIDIA A40", "count": 1}})
    running(standin.world, record)
    monkeypatch.setenv("PODGUARD_SELF_HEAL_RESTART_WAIT_S", "30")
    main = threading.main_thread().ident
    assert main is not None

    def kill_once_stopped() -> None:
        deadline = time.monotonic() + 30
        while record.status != "EXITED" and time.monotonic() < deadline:
            time.sleep(0.005)
        signal.pthread_kill(main, signal.SIGTERM)

    killer = threading.Thread(target=kill_once_stopped, daemon=True)
    killer.start()
    with console.captured():
        ended = end_billing(record.id, "job succeeded", by="--on-exit stop-pod")
    killer.join(timeout=5)
    assert (ended.asked, ended.signal) == ("stop", signal.SIGTERM)

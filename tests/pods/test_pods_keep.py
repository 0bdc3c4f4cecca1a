"""`podguard pod keep`: each case of the contract (docs/running-pods.md, "Keeping a job alive overnight"), the
real CLI as a process against the stand-in RunPod over real HTTP and SSE; the test plays RunPod and the job in the
pod.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from keep_support import (
    CLUSTER_SPEC,
    NETWORK,
    assert_no_key,
    events,
    finish,
    keep,
    live_pod,
    live_pods,
    maintenance,
    passes,
    say_end,
    state,
    wait_event,
    wait_for,
)
from pods_support import A40_SPEC, pg, standin, write_spec  # noqa: F401 (fixture)


def actions(standin) -> list[str]:  # noqa: F811
    return [json.loads(c.body)["action"] for c in standin.calls("POST", r"/action$")]


def creates(standin) -> list[dict]:  # noqa: F811
    return [json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$")]


# -- respect: the job's own outcome ---------------------------------------------------------------------------
def test_success_stops_the_pod_and_exits_0(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec, "--json")
    passes(tmp_path)
    pod = live_pod(standin.world)
    say_end(standin.world, pod, "success", 0, detail="job finished successfully in 812.4 s (2 worker(s))")
    code, out, err = finish(proc)
    assert code == 0, err
    assert pod.status == "EXITED" and actions(standin) == ["stop"] and len(creates(standin)) == 1
    result = json.loads(out)
    assert result["outcome"] == "success" and result["recoveries"] == 0 and result["id"] == pod.id
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds[0] == "begin" and "up" in kinds and kinds[-1] == "end"
    assert "the job succeeded" in err and state(tmp_path)["phase"] == "done"
    assert_no_key(standin, tmp_path, out, err)


def test_a_restart_line_is_not_the_end(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    standin.world.emit(pod.id, "podguard train: RESTART 1 of 3 in 1 s after crash (exit 1), exit 1")
    wait_event(tmp_path, "restart")
    time.sleep(0.5)
    assert proc.poll() is None and pod.status == "RUNNING" and actions(standin) == []
    say_end(standin.world, pod, "success", 0, attempts=2)
    assert finish(proc)[0] == 0


def test_the_jobs_own_failure_stops_the_pod_and_exits_its_code(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    say_end(standin.world, pod, "failed", 3, attempts=3, detail="worker 0 exited 3")
    code, _, err = finish(proc)
    assert code == 3, err
    assert pod.status == "EXITED" and actions(standin) == ["stop"] and len(creates(standin)) == 1
    assert "the job failed with exit 3" in err


def test_an_in_pod_guard_is_respected_nothing_restarted_124(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    world = standin.world
    world.emit(pod.id, "podguard: billing guard --max-runtime: the job has run for 2h (limit 2h); stopping 2 worker(s)")
    say_end(world, pod, "guard", 124, detail="--max-runtime")
    world.act(pod.id, "stop")  # the guard stops its own pod
    code, _, err = finish(proc)
    assert code == 124, err
    assert "start" not in actions(standin) and len(creates(standin)) == 1 and pod.status == "EXITED"


def test_a_guard_line_then_the_pod_stopped_before_its_end_line_is_still_the_guard(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    standin.world.emit(pod.id, "podguard: billing guard --idle-stop: every GPU at or below 5 % utilisation for 30m")
    wait_event(tmp_path, "guard")
    standin.world.act(pod.id, "stop")  # the END line never came through
    code, _, err = finish(proc)
    assert code == 124, err
    assert actions(standin) == [] and len(creates(standin)) == 1


# -- recoveries ------------------------------------------------------------------------------------------------
def test_maintenance_exited_without_an_outcome_is_started_again(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    maintenance(standin.world, pod)
    passes(tmp_path, 2)  # the same pod, started again: its preflight passed
    assert actions(standin) == ["start"] and live_pod(standin.world).id == pod.id
    (recovery,) = wait_event(tmp_path, "recovery")
    assert recovery["action"] == "start" and "EXITED without an outcome" in recovery["text"]
    say_end(standin.world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert actions(standin) == ["start", "stop"] and len(creates(standin)) == 1
    assert state(tmp_path)["recoveries"] == 1


def test_a_start_refused_for_a_full_host_replaces_the_pod(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    standin.world.host_full_on_start = True
    maintenance(standin.world, old)
    passes(tmp_path, 2)
    new = live_pod(standin.world)
    assert new.id != old.id and old.status == "TERMINATED"
    assert "not enough free GPUs on the host" in wait_event(tmp_path, "recovery", 1, text="replacing")[0]["text"]
    say_end(standin.world, new, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert state(tmp_path)["recoveries"] == 1  # a refused start and its replacement are one recovery


def test_host_loss_with_a_network_volume_replaces_it_keeping_name_volume_and_data_centre(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    standin.world.lose_host(old.id)  # RUNNING on paper, no runtime, silent: after the (shortened) 15 minutes
    passes(tmp_path, 2)
    new = live_pod(standin.world)
    assert new.id != old.id and old.status == "TERMINATED"
    same = ("name", "image", "args", "env", "ports", "gpu_type", "gpu_count", "mounts")
    assert {k: getattr(new, k) for k in same} == {k: getattr(old, k) for k in same}
    assert new.mounts == {"network": [{"volumeId": "vol-1", "path": "/workspace"}]}
    assert new.machine.dc == old.machine.dc  # a network volume lives in one data centre
    assert "no runtime and no log line" in wait_event(tmp_path, "recovery")[0]["text"]
    say_end(standin.world, new, "success", 0)
    assert finish(proc)[0] == 0


def test_host_loss_without_a_network_volume_refuses_to_replace_69(standin, bare_spec, tmp_path):  # noqa: F811
    proc = keep(bare_spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    standin.world.lose_host(old.id)
    code, _, err = finish(proc)
    assert code == 69, err
    assert "[network_volume]" in err and "would lose the pod's data" in err
    assert len(creates(standin)) == 1 and standin.calls("DELETE") == []  # nothing replaced, nothing deleted
    assert old.status == "EXITED"  # stopped (billing ends), its disk kept


def test_error_is_replaced(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    standin.world.set_error(old.id)
    passes(tmp_path, 2)
    new = live_pod(standin.world)
    assert new.id != old.id and old.status == "TERMINATED"
    assert "in ERROR" in wait_event(tmp_path, "recovery")[0]["text"]
    say_end(standin.world, new, "success", 0)
    assert finish(proc)[0] == 0


def test_a_vanished_pod_is_replaced(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    standin.world.vanish(old.id)
    passes(tmp_path, 2)
    assert live_pod(standin.world).id != old.id
    assert "gone" in wait_event(tmp_path, "recovery")[0]["text"]
    say_end(standin.world, live_pod(standin.world), "success", 0)
    assert finish(proc)[0] == 0


def test_a_preflight_failing_on_three_starts_in_a_row_is_replaced(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    for _ in range(2):  # the container restarts; its preflight finds a fallen GPU each time
        standin.world.emit(old.id, "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms")
        standin.world.emit(old.id, "podguard train: END preflight exit 76 after 1 attempt(s)")
    wait_event(tmp_path, "verdict", 2, text="UNHEALTHY")
    assert proc.poll() is None and len(creates(standin)) == 1  # two in a row are not enough
    standin.world.emit(old.id, "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms")
    passes(tmp_path, 2)
    new = live_pod(standin.world)
    assert new.id != old.id and "3 starts in a row" in wait_event(tmp_path, "recovery")[0]["text"]
    say_end(standin.world, new, "success", 0)
    assert finish(proc)[0] == 0


def test_a_gpu_fault_ends_the_job_on_a_sick_machine_replace(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    say_end(standin.world, old, "gpu-fault", 76, detail="GPU 3 Xid 79")
    passes(tmp_path, 2)
    assert live_pod(standin.world).id != old.id
    say_end(standin.world, live_pod(standin.world), "success", 0)
    assert finish(proc)[0] == 0


def test_a_lost_create_answer_during_a_replacement_is_adopted_not_duplicated(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    standin.fault("POST", r"^/v2/pods$", "lost")  # the replacement is made, its answer never arrives
    standin.world.set_error(old.id)
    passes(tmp_path, 2)
    assert len(creates(standin)) == 2  # the first pod and the replacement: never sent twice
    (new,) = live_pods(standin.world)
    assert new.id != old.id
    say_end(standin.world, new, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert "the create answer was lost" in err


def test_capacity_that_is_not_there_is_waited_for_with_announced_backoff(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(standin.world)
    world = standin.world
    with world.lock:
        saved = dict(world.capacity)
        world.capacity.update({k: -100 for k in world.capacity})  # none, even with the old pod's GPUs given back
    world.set_error(old.id)
    waits = wait_event(tmp_path, "capacity", 2)
    assert [w["wait_s"] for w in waits[:2]] == [0.3, 0.6]  # announced, doubling (to its cap)
    with world.lock:
        world.capacity.update(saved)
    passes(tmp_path, 2)
    say_end(world, live_pod(world), "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert "trying again in 0.3 s (try 1)" in err and state(tmp_path)["recoveries"] == 1


def test_give_up_after_max_recoveries_leaves_nothing_running_75(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec, "--max-recoveries", "2")
    passes(tmp_path)
    first = live_pod(world)
    world.new_machine_health = ["error"] * 5  # every replacement ends in ERROR on boot
    world.set_error(first.id)
    code, _, err = finish(proc)
    assert code == 75, err
    assert len(creates(standin)) == 3 and "giving up" in err and "--max-recoveries 2" in err
    assert [p.status for p in world.pods.values() if p.name == "trainer"].count("RUNNING") == 0
    assert state(tmp_path)["outcome"] == "gave-up" and state(tmp_path)["recoveries"] == 2


def test_give_up_stops_a_running_pod(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec, "--max-recoveries", "0")
    passes(tmp_path)
    pod = live_pod(standin.world)
    standin.world.emit(pod.id, "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms")
    standin.world.emit(pod.id, "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms")
    standin.world.emit(pod.id, "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms")
    code, _, err = finish(proc)
    assert code == 75, err
    assert pod.status == "EXITED" and actions(standin) == ["stop"] and len(creates(standin)) == 1


# -- one pod per name, a keeper killed and started again ---------------------------------------------------------
def test_keep_killed_and_started_again_resumes_without_a_second_pod(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    maintenance(world, pod)
    passes(tmp_path, 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    world.emit(pod.id, "a line written while no keeper watched")
    again = keep(spec)
    wait_event(tmp_path, "resume")
    assert "recoveries so far: 1" in wait_event(tmp_path, "resume")[0]["text"]
    say_end(world, pod, "success", 0)
    code, _, err = finish(again)
    assert code == 0, err
    assert len(creates(standin)) == 1 and live_pod(world).id == pod.id
    assert state(tmp_path)["recoveries"] == 1
    assert "Last-Event-ID" in standin.calls("GET", r"/logs$")[-1].headers  # the stream resumed after its last event


def test_keep_killed_during_a_replacement_adopts_the_replacement_when_started_again(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    standin.fault("POST", r"^/v2/pods$", "slow", delay=1.0)  # the create happens after its sender is gone
    world.set_error(old.id)
    wait_for(lambda: len(standin.calls("POST", r"^/v2/pods$")) == 2, what="the replacement's create request")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: live_pods(world) and live_pods(world)[0].id != old.id, what="the replacement")
    assert state(tmp_path)["phase"] == "replacing"
    again = keep(spec)
    passes(tmp_path, 2)
    (new,) = live_pods(world)
    say_end(world, new, "success", 0)
    code, _, err = finish(again)
    assert code == 0, err
    assert len(creates(standin)) == 2 and live_pods(world) == [new] and new.status == "EXITED"
    assert state(tmp_path)["recoveries"] == 1 and "the replacement exists" in err


def test_a_second_keeper_of_the_same_name_is_refused(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    before = len(standin.requests)
    second = pg(["pod", "keep", "--spec", str(spec)])
    assert second.returncode == 64 and "kept already" in second.stderr, second.stderr
    assert [r.path for r in standin.requests[before:] if r.path != "/v2/pods"] == []  # the first keeper's polls only
    say_end(standin.world, live_pod(standin.world), "success", 0)
    assert finish(proc)[0] == 0


# -- clusters ----------------------------------------------------------------------------------------------------
def test_a_cluster_member_lost_recreates_the_whole_cluster(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec)
    passes(tmp_path, 2, name="ring")
    (first,) = world.clusters.values()
    node1 = world.pods[first.members[1]]
    world.set_error(node1.id)
    passes(tmp_path, 4, name="ring")  # both nodes of the new cluster
    (second,) = world.clusters.values()
    assert second.id != first.id and second.name == "ring" and second.dc == first.dc
    assert len(standin.calls("POST", r"^/v2/clusters$")) == 2 and standin.calls("POST", r"/action$") == []
    assert "node1 (ERROR)" in wait_event(tmp_path, "recovery", name="ring")[0]["text"]
    node0 = world.pods[second.members[0]]
    say_end(world, world.pods[second.members[1]], "success", 0)  # node 1's END is not the job's
    time.sleep(0.5)
    assert proc.poll() is None
    say_end(world, node0, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert world.clusters == {} and "deleted" in err  # a cluster has no stop: deleting it ends its billing


def test_a_cluster_nodes_failure_line_ends_it(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec)
    passes(tmp_path, 2, name="ring")
    (cluster,) = world.clusters.values()
    say_end(world, world.pods[cluster.members[1]], "failed", 1, detail="rank 3 exited 1")
    code, _, err = finish(proc)
    assert code == 1, err
    assert world.clusters == {} and len(standin.calls("POST", r"^/v2/clusters$")) == 1


# -- options, notify, the key -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--poll", "0"], "--poll 0"),
        (["--poll", "-5"], "--poll -5"),
        (["--poll", "nan"], "--poll nan"),
        (["--max-recoveries", "-1"], "--max-recoveries -1"),
        (["--max-recoveries", "two"], "--max-recoveries"),
        (["--notify", "ftp://hooks.example/x"], "--notify"),
        (["--notify", "not a url"], "--notify"),
        (["--key-secret", "runpod_api_key"], "--key-secret"),
        (["--deploy", "--key-secret", "bad name"], "--key-secret 'bad name'"),
        (["--api", "soap"], "--api"),
    ],
)
def test_bad_options_are_64_naming_the_value_with_no_request(standin, spec, args, named):  # noqa: F811
    proc = pg(["pod", "keep", "--spec", str(spec), *args])
    assert proc.returncode == 64, proc.stderr
    assert named in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert standin.requests == []


def test_a_bad_spec_or_none_is_64_with_no_request(standin, tmp_path):  # noqa: F811
    bad = write_spec(tmp_path / "bad.toml", A40_SPEC.replace('cloud = "SECURE"', "").replace("count = 2", "count = 99"))
    proc = pg(["pod", "keep", "--spec", str(bad)])
    assert proc.returncode == 64 and "[gpu] count" in proc.stderr
    missing = pg(["pod", "keep"])
    assert missing.returncode == 64 and "--spec FILE is required" in missing.stderr
    assert standin.requests == []


def test_notify_posts_text_and_content_for_each_recovery_and_the_end_never_the_key(standin, spec, tmp_path):  # noqa: F811
    from hook_support import Hook

    with Hook() as hook:
        proc = keep(spec, "--notify", hook.url)
        passes(tmp_path)
        pod = live_pod(standin.world)
        maintenance(standin.world, pod)
        passes(tmp_path, 2)
        say_end(standin.world, pod, "success", 0)
        code, out, err = finish(proc)
        assert code == 0, err
        posts = wait_for(lambda: hook.bodies if len(hook.bodies) >= 2 else None, what="two webhook posts")
    assert all(set(p) == {"text", "content"} and p["text"] == p["content"] for p in posts)
    assert "trainer" in posts[0]["text"] and "starting it" in posts[0]["text"]
    assert "the job succeeded" in posts[-1]["text"]
    assert all(h.get("Content-Type") == "application/json" for h in hook.headers)
    assert_no_key(standin, tmp_path, out, err, *(json.dumps(p) for p in posts))


def test_a_webhook_that_fails_is_one_warning_and_the_keeper_goes_on(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec, "--notify", "http://127.0.0.1:9/hook/secret-path")
    passes(tmp_path)
    pod = live_pod(standin.world)
    say_end(standin.world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0
    assert "--notify to http://127.0.0.1:9/... failed" in err and "secret-path" not in err


def test_every_line_of_a_keeper_carries_its_name(standin, spec, tmp_path):  # noqa: F811
    """The keeper's lines are tagged with its name (console.tagged), its events and its warnings alike: a notifier's
    warning, said from the notifier's own thread, names the keeper too (it did not before)."""
    proc = keep(spec, "--notify", "http://127.0.0.1:9/hook/secret-path")
    passes(tmp_path)
    pod = live_pod(standin.world)
    say_end(standin.world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("podguard: ")]
    assert lines and all("keep trainer: " in line for line in lines), err
    warned = [line for line in lines if "--notify to http://127.0.0.1:9/... failed" in line]
    assert warned and all(line.startswith("podguard: warning: keep trainer: ") for line in warned), err
    assert any(line.startswith("podguard: keep trainer: ") for line in lines), err  # its events


# -- quiet while nothing happens ---------------------------------------------------------------------------------
def test_while_nothing_happens_one_status_request_per_poll_and_one_log_stream(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec, poll="0.25")
    passes(tmp_path)
    pod = live_pod(standin.world)
    time.sleep(0.5)
    start = time.monotonic()
    before = len(standin.requests)
    for i in range(20):  # the job talks; nothing happens
        standin.world.emit(pod.id, f"step {i} loss 0.{i}")
        time.sleep(0.1)
    window = time.monotonic() - start
    during = standin.requests[before:]
    status = [r for r in during if r.method == "GET" and r.path == "/v2/pods"]  # one listing of the name a poll
    assert len(during) == len(status)  # nothing but status requests: no log polling, no reopened stream
    assert len(status) <= window / 0.25 + 1
    say_end(standin.world, pod, "success", 0)
    assert finish(proc)[0] == 0
    assert len(standin.calls("GET", r"/logs$")) == 1  # one log stream for the whole watch


# -- --deploy, status, down ----------------------------------------------------------------------------------------
def test_deploy_twice_makes_one_keeper_pod_with_the_key_only_as_a_secret_reference(standin, spec, tmp_path):  # noqa: F811
    import base64

    assert pg(["pod", "up", "--spec", str(spec)]).returncode == 0
    first = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--json"])
    assert first.returncode == 0, first.stderr
    second = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--key-secret", "my_key"])
    assert second.returncode == 0, second.stderr
    keepers = [b for b in creates(standin) if b["name"] == "trainer-keeper"]
    assert len(keepers) == 1 and len(live_pods(standin.world, "trainer-keeper")) == 1
    body = keepers[0]
    assert body["env"]["RUNPOD_API_KEY"] == "{{ RUNPOD_SECRET_runpod_api_key }}"
    assert base64.b64decode(body["env"]["PODGUARD_KEEP_SPEC_B64"]) == spec.read_bytes()  # the spec, unchanged
    assert body["env"]["PODGUARD_KEEPER_OF"] == "trainer" and body["args"] == "pod keep"
    assert body["cpu"] == {"id": "cpu3c", "vcpuCount": 2} and "gpu" not in body
    assert body["image"] == "registry.example/me/podguard:0.2"
    assert json.loads(first.stdout)["action"] == "created" and "reused" in second.stderr
    status = json.loads(pg(["pod", "status", "trainer", "--json"]).stdout)
    assert status["kept_by"] == "trainer-keeper"
    assert "kept by:  trainer-keeper" in pg(["pod", "status", "trainer"]).stdout
    assert_no_key(standin, tmp_path, first.stdout, first.stderr, second.stdout, second.stderr)
    down = pg(["pod", "down", "trainer"])
    assert down.returncode == 0, down.stderr
    deleted = [c.path for c in standin.calls("DELETE", r"^/v2/pods/")]
    keeper_id = live_pods(standin.world, "trainer-keeper") or None
    assert keeper_id is None and len(deleted) == 2
    assert standin.world.pods[deleted[0].rsplit("/", 1)[1]].name == "trainer-keeper"  # the keeper first


def test_a_secret_reference_in_the_spec_stays_a_reference_in_the_keeper_pod(standin, tmp_path):  # noqa: F811
    import base64

    text = NETWORK.replace('WANDB_PROJECT = "demo"', 'HF_TOKEN = "{{ RUNPOD_SECRET_hf_token }}"')
    spec = write_spec(tmp_path / "secret.toml", text)
    proc = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--notify", "{{ RUNPOD_SECRET_hook }}"])
    assert proc.returncode == 0, proc.stderr
    (body,) = creates(standin)
    assert b"{{ RUNPOD_SECRET_hf_token }}" in base64.b64decode(body["env"]["PODGUARD_KEEP_SPEC_B64"])
    assert body["env"]["PODGUARD_NOTIFY"] == "{{ RUNPOD_SECRET_hook }}"


def test_a_pod_kept_by_a_keeper_pod_is_not_kept_a_second_time_from_a_laptop(standin, spec, tmp_path):  # noqa: F811
    assert pg(["pod", "keep", "--spec", str(spec), "--deploy"]).returncode == 0
    proc = pg(["pod", "keep", "--spec", str(spec)])
    assert proc.returncode == 64 and "trainer-keeper" in proc.stderr
    assert [b["name"] for b in creates(standin)] == ["trainer-keeper"]


def test_pod_down_ends_a_local_keeper_first_and_nothing_is_replaced(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    status = json.loads(pg(["pod", "status", "trainer", "--json"]).stdout)
    assert status["kept_by"] == f"pid {proc.pid} on this machine"
    down = pg(["pod", "down", "trainer"])
    assert down.returncode == 0, down.stderr
    assert "ending the keeper of trainer" in down.stderr
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert pod.status == "TERMINATED" and len(creates(standin)) == 1
    assert state(tmp_path)["outcome"] == "down"
    again = keep(spec)  # a new keep starts afresh: it does not resume what `pod down` removed
    wait_event(tmp_path, "begin", 2)
    again.send_signal(signal.SIGTERM)
    finish(again)


def test_inside_a_keeper_pod_the_spec_comes_from_its_environment_and_the_pod_ends_itself(standin, spec, tmp_path):  # noqa: F811
    import base64

    keeper = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--json"])
    keeper_id = json.loads(keeper.stdout)["id"]
    (body,) = creates(standin)
    env = {k: v for k, v in body["env"].items() if k != "RUNPOD_API_KEY"}  # RunPod fills in the secret: the test's key
    env["RUNPOD_POD_ID"] = keeper_id
    assert base64.b64decode(env["PODGUARD_KEEP_SPEC_B64"])
    import os
    import subprocess

    from keep_support import KEEP_FAST
    from pods_support import PODGUARD

    inside = subprocess.Popen(
        [*PODGUARD, "pod", "keep"],
        env={**os.environ, **KEEP_FAST, **env, "PODGUARD_POLL": "0.1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    passes(tmp_path)
    say_end(standin.world, live_pod(standin.world), "success", 0)
    code, _, err = finish(inside)
    assert code == 0, err
    assert standin.world.pods[keeper_id].status == "TERMINATED"  # its work done, the keeper pod ended itself


def test_a_full_host_without_a_network_volume_is_69_and_nothing_is_made(standin, bare_spec, tmp_path):  # noqa: F811
    proc = keep(bare_spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    standin.world.host_full_on_start = True
    maintenance(standin.world, pod)
    code, _, err = finish(proc)
    assert code == 69, err
    assert "[network_volume]" in err and len(creates(standin)) == 1 and pod.status == "EXITED"
    assert state(tmp_path)["recoveries"] == 0


def test_a_cluster_node_whose_host_is_lost_recreates_the_cluster(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec)
    passes(tmp_path, 2, name="ring")
    (first,) = world.clusters.values()
    node0, node1 = (world.pods[m] for m in first.members)
    world.lose_host(node1.id)  # RUNNING on paper: only the member listing shows its missing runtime
    stop = time.monotonic() + 2.5
    while time.monotonic() < stop:  # node 0's job keeps talking: only node 1 is silent
        world.emit(node0.id, "step")
        time.sleep(0.1)
    passes(tmp_path, 4, name="ring")
    (second,) = world.clusters.values()
    assert second.id != first.id
    recovery = wait_event(tmp_path, "recovery", name="ring")[0]["text"]
    assert "no runtime and no log line" in recovery and "node1" in recovery and "node0" not in recovery
    say_end(world, world.pods[second.members[0]], "success", 0)
    assert finish(proc)[0] == 0


def test_keep_interrupted_before_its_first_pod_existed_makes_it_when_started_again(standin, bare_spec, tmp_path):  # noqa: F811
    world = standin.world
    with world.lock:
        saved = dict(world.capacity)
        world.capacity.update({k: -100 for k in world.capacity})  # no capacity for the first `pod up`
    proc = keep(bare_spec)
    wait_event(tmp_path, "capacity")
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM and not live_pods(world), err
    with world.lock:
        world.capacity.update(saved)
    again = keep(bare_spec)  # no pod was ever made: nothing lost, no recovery, no refusal for the missing volume
    passes(tmp_path)
    say_end(world, live_pod(world), "success", 0)
    code, _, err = finish(again)
    assert code == 0, err
    assert "was made before: `pod up` now" in err, err
    assert len(live_pods(world)) == 1 and state(tmp_path)["recoveries"] == 0


def test_a_cluster_nodes_failure_that_follows_a_lost_peer_recreates_the_cluster(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec)
    passes(tmp_path, 2, name="ring")
    (first,) = world.clusters.values()
    node0, node1 = (world.pods[m] for m in first.members)
    world.lose_host(node1.id)  # node 1's host goes; node 0's job fails on its NCCL error within seconds
    say_end(world, node0, "failed", 1, detail="rank 0 exited 1")
    passes(tmp_path, 4, name="ring")
    (second,) = world.clusters.values()
    assert second.id != first.id
    recovery = wait_event(tmp_path, "recovery", name="ring")[0]["text"]
    assert "node1 was lost" in recovery, recovery
    say_end(world, world.pods[second.members[0]], "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err


def _inside_keeper(standin, spec, extra_env, before=lambda: None):  # noqa: F811
    """Deploy a keeper pod, then (after `before()`) run `pod keep` the way its container would (RunPod filled in
    the secret)."""
    import os
    import subprocess

    from keep_support import KEEP_FAST
    from pods_support import PODGUARD

    keeper_id = json.loads(pg(["pod", "keep", "--spec", str(spec), "--deploy", "--json"]).stdout)["id"]
    (body,) = creates(standin)
    env = {k: v for k, v in body["env"].items() if k != "RUNPOD_API_KEY"}
    env["RUNPOD_POD_ID"] = keeper_id
    before()
    proc = subprocess.run(
        [*PODGUARD, "pod", "keep"],
        env={**os.environ, **KEEP_FAST, **env, "PODGUARD_POLL": "0.1", **extra_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return keeper_id, proc


def test_a_keeper_pod_that_cannot_go_on_stops_itself_instead_of_crash_looping(standin, spec, tmp_path):  # noqa: F811
    def refuse_creates() -> None:  # the account may not create the kept pod: no retry fixes that
        standin.fault("POST", r"^/v2/pods$", "403", times=5)

    keeper_id, proc = _inside_keeper(standin, spec, {"PODGUARD_KEEP_PARK_S": "30"}, refuse_creates)
    assert proc.returncode == 77, proc.stderr
    assert standin.world.pods[keeper_id].status == "EXITED", proc.stderr  # stopped: its logs still say why
    assert "the keeper cannot go on" in proc.stderr and "waits" not in proc.stderr  # stopped: no wait needed


def test_a_keeper_pod_whose_key_is_refused_waits_before_exiting(standin, spec, tmp_path):  # noqa: F811
    started = time.monotonic()
    keeper_id, proc = _inside_keeper(standin, spec, {"RUNPOD_API_KEY": "rpa_wrong", "PODGUARD_KEEP_PARK_S": "1.5"})
    assert proc.returncode == 77, proc.stderr
    assert standin.world.pods[keeper_id].status == "RUNNING"  # a refused key cannot stop anything
    assert "cannot stop itself, so it waits 1.5 s before exiting" in proc.stderr
    assert time.monotonic() - started >= 1.5 and "rpa_wrong" not in proc.stderr + proc.stdout

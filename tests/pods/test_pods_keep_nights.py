"""Issue 29's nights that lost money, each as it was found: creates and starts that land late, a `pod down` or `pod
stop` at the worst moment, SIGKILLs, a full disk, a 409, unknown statuses, a crash loop, a stop answered 200 and
not carried out, a slow webhook at the end, an ERROR pod at a give-up, a keeper pod whose disk was reset. The real
CLI as a process against the stand-in RunPod over real HTTP; the test plays RunPod and the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from hook_support import Hook
from keep_support import (
    KEEP_FAST,
    NETWORK,
    POLL,
    billing,
    finish,
    inside_keeper,
    intent,
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
from pods_support import A40_SPEC, PODGUARD, pg, standin, write_spec  # noqa: F401 (fixture)


def creates(standin, name: str = "trainer") -> list[dict]:  # noqa: F811
    return [b for b in (json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$")) if b["name"] == name]


def actions(standin, pod_id: str = "") -> list[str]:  # noqa: F811
    return [json.loads(c.body)["action"] for c in standin.calls("POST", rf"{pod_id}/action$")]


# -- 1. `pod down` while the keeper's create backs off on a 429 ------------------------------------------------------
def test_pod_down_while_a_create_backs_off_on_429_leaves_nothing_billing(standin, bare_spec, tmp_path):  # noqa: F811
    standin.fault("POST", r"^/v2/pods$", "429", retry_after="1.5")  # RunPod asks to wait before the next try ...
    standin.fault("POST", r"^/v2/pods$", "late", delay=2.0)  # ... whose answer is lost: the pod lands 2 s later
    proc = keep(bare_spec)
    wait_for(lambda: creates(standin), what="the keeper's first create (answered 429)")
    down = pg(["pod", "down", "trainer"])
    assert down.returncode == 0, down.stderr
    _, _, err = finish(proc)
    time.sleep(3.0)  # past any create the keeper sent and its landing
    assert not live_pods(standin.world), (down.stderr, err)
    assert intent(standin)["word"] == "down"  # the keeper's last save did not overwrite the user's word
    assert state(tmp_path)["outcome"] == "down" and state(tmp_path)["phase"] == "done"


# -- 2. `pod down` of a deployed keep while the keeper pod's create is in flight -------------------------------------
def test_pod_down_of_a_deployed_keep_waits_for_its_create_to_land(standin, bare_spec, tmp_path):  # noqa: F811
    standin.fault("POST", r"^/v2/pods$", "late", delay=2.0, body_contains='"name": "trainer"')
    keeper_id, proc = inside_keeper(standin, bare_spec, {}, popen=True)
    wait_for(lambda: standin.landed or len(creates(standin)) >= 1, what="the keeper pod's create")
    down = subprocess.Popen([*PODGUARD, "pod", "down", "trainer"], stderr=subprocess.PIPE, text=True)
    wait_for(lambda: standin.world.pods[keeper_id].status == "TERMINATED", what="the keeper pod terminated")
    proc.kill()  # RunPod ends the terminated keeper pod's container
    proc.wait()
    _, err = down.communicate(timeout=60)
    assert down.returncode == 0, err
    assert "waiting up to" in err  # it says why it waits
    assert standin.landed and not billing(standin.world), err  # the late create landed during the sweep: taken down


# -- 3. `pod stop` while the keeper's start of an EXITED pod is in flight --------------------------------------------
def test_pod_stop_while_a_start_is_in_flight_leaves_the_pod_stopped(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    standin.fault("POST", r"/action$", "late", delay=2.0, body_contains='"start"')  # the start lands 2 s later
    maintenance(world, pod)
    wait_for(lambda: "start" in actions(standin), what="the keeper's start")
    stop = pg(["pod", "stop", "trainer"])
    assert stop.returncode == 0, stop.stderr
    finish(proc)
    wait_for(lambda: standin.landed, what="the late start")
    time.sleep(1.0)
    assert pod.status == "EXITED" and intent(standin)["word"] == "stopped", stop.stderr


# -- 4. a create that lands after the client gave up -----------------------------------------------------------------
def test_a_create_that_lands_late_is_terminated_at_the_next_poll(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    standin.fault("POST", r"^/v2/pods$", "late", delay=1.5)  # the answer is lost; the pod lands later
    proc = keep(spec)
    passes(tmp_path)
    wait_for(lambda: standin.landed, what="the late create")
    (surplus,) = wait_event(tmp_path, "surplus")
    wait_for(lambda: len(live_pods(world)) == 1, what="one pod of the name")
    (kept,) = live_pods(world)
    assert surplus["target"] != kept.id and world.pods[surplus["target"]].status == "TERMINATED"
    say_end(world, kept, "success", 0)
    assert finish(proc)[0] == 0
    assert not billing(world)


def test_a_keep_that_ends_with_a_create_in_flight_waits_for_it_and_terminates_it(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    standin.fault("POST", r"^/v2/pods$", "late", delay=3.5)  # the replacement's first answer is lost; it lands late
    world.set_error(live_pod(world).id)
    passes(tmp_path, 2)  # the keeper made another (nothing of the name was there), which runs the job
    new = next(p for p in live_pods(world) if p.status == "RUNNING")
    say_end(world, new, "success", 0)  # the job ends before the lost create lands
    code, _, err = finish(proc)
    assert code == 0 and standin.landed, err  # it waited for its own create to land, and took it down
    assert not billing(world), err


def test_a_keeper_killed_with_a_late_create_in_flight_leaves_one_pod(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    standin.fault("POST", r"^/v2/pods$", "late", delay=2.0)
    proc = keep(spec)
    wait_for(lambda: creates(standin), what="the keeper's create")
    proc.send_signal(signal.SIGKILL)  # killed with the create in flight
    proc.wait()
    again = keep(spec)
    wait_for(lambda: standin.landed, what="the late create")
    wait_for(lambda: len(live_pods(world)) == 1 and live_pods(world)[0].status == "RUNNING", what="one pod")
    passes(tmp_path)
    (kept,) = live_pods(world)
    say_end(world, kept, "success", 0)
    assert finish(again)[0] == 0
    assert not billing(world)


# -- 7. the keeper's own faults never bill ---------------------------------------------------------------------------
def test_a_state_write_that_fails_is_a_warning_and_the_end_still_stops(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    path = tmp_path / "state" / "keep" / "trainer.json"
    path.unlink()
    path.mkdir()  # the state can no longer be written (as on a full disk): os.replace onto a folder fails
    say_end(standin.world, live_pod(standin.world), "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert "cannot write the keeper's state" in err and "Traceback" not in err
    assert live_pod(standin.world).status == "EXITED"


def test_a_registry_that_cannot_be_written_is_a_warning_not_the_end(standin, spec, tmp_path):  # noqa: F811
    (tmp_path / "not-a-folder").write_text("")
    proc = keep(spec, env={"PODGUARD_KEEPERS_DIR": str(tmp_path / "not-a-folder")})
    passes(tmp_path)
    say_end(standin.world, live_pod(standin.world), "success", 0)
    code, _, err = finish(proc)
    assert code == 0 and "the keepers' registry cannot be used" in err and "Traceback" not in err, err


def test_an_unexpected_exception_in_a_keeper_pod_stops_its_own_pod(standin, spec, tmp_path):  # noqa: F811
    deployed = pg(["pod", "keep", "--spec", str(spec), "--deploy", "--json"])
    assert deployed.returncode == 0, deployed.stderr
    record = intent(standin)
    (tmp_path / "state" / "keep").mkdir(parents=True)
    broken = {"name": "trainer", "kind": "pod", "gen": record["gen"], "keep_id": record["keep"], "made": True}
    broken["streaks"] = {"node-zero": 1}  # a state this keeper cannot read back: a bug of its own
    (tmp_path / "state" / "keep" / "trainer.json").write_text(json.dumps(broken))
    (body,) = [json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$") if b"-keeper" in c.body]
    env = {k: v for k, v in body["env"].items() if k != "RUNPOD_API_KEY"}
    keeper_id = json.loads(deployed.stdout)["id"]
    run = subprocess.run(
        [*PODGUARD, "pod", "keep"],
        env={**os.environ, **KEEP_FAST, **env, "RUNPOD_POD_ID": keeper_id, "PODGUARD_KEEP_PARK_S": "0.1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "unexpected ValueError" in run.stderr, run.stderr
    assert standin.world.pods[keeper_id].status == "EXITED"  # stopped, not left crash-looping


# -- 10. an unknown or missing status is unknown, and a 409 is no reason to end --------------------------------------
def test_an_unknown_or_missing_status_is_read_again_never_error(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    world.odd_status(pod.id, "RESTARTING", 1.5)  # a status RunPod's spec does not list, for a moment
    time.sleep(2.0)
    world.odd_status(pod.id, None, 1.5)  # an answer without a status
    time.sleep(2.0)
    assert live_pods(world) == [pod] and len(creates(standin)) == 1  # nothing replaced
    say_end(world, pod, "success", 0)
    assert finish(proc)[0] == 0


def test_a_409_on_a_terminate_is_read_again_and_the_keeper_goes_on(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    standin.fault("DELETE", r"^/v2/pods/", "409")  # the pod is changing state: RunPod refuses the terminate once
    world.set_error(old.id)
    passes(tmp_path, 2)
    (new,) = live_pods(world)
    assert new.id != old.id and old.status == "TERMINATED"
    say_end(world, new, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err


# -- 13. a crash loop is the job's failure ---------------------------------------------------------------------------
def test_a_container_that_crash_loops_is_stopped_and_said(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "pod.toml", NETWORK.replace("timeout_s = 30", "timeout_s = 3"))
    world.script = lambda pod: []  # the entrypoint never gets to podguard's preflight
    with Hook() as hook:
        proc = keep(spec, "--notify", hook.url)
        wait_for(lambda: live_pods(world) and live_pods(world)[0].status == "RUNNING", what="the pod running")
        world.crash_loop(live_pod(world).id)
        code, _, err = finish(proc, timeout=60)
        assert code == 1, err
        assert "crash-loops" in err and live_pod(world).status == "EXITED"
        assert any("crash-loops" in b["text"] for b in hook.bodies)


def test_a_container_started_again_and_again_by_itself_is_a_crash_loop(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    for n in range(5):  # RunPod restarts the container: each start prints a fresh preflight line, no RESTART line
        world.restart_container(pod.id)
        passes(tmp_path, n + 2)
    code, _, err = finish(proc, timeout=60)
    assert code == 1 and "started again 5 times within 10m" in err, err
    assert pod.status == "EXITED" and len(creates(standin)) == 1


# -- 14. a stop answered 200 but not carried out ---------------------------------------------------------------------
def test_a_stop_answered_but_not_carried_out_is_made_again(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec, env={"PODGUARD_KEEP_CONFIRM_S": "2"})
    passes(tmp_path)
    pod = live_pod(world)
    world.ignore_stops = 1
    say_end(world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert pod.status == "EXITED" and actions(standin, pod.id).count("stop") == 2


# -- 17. the end message is delivered before the keeper pod ends itself ----------------------------------------------
def test_a_keeper_pod_delivers_its_end_message_before_it_ends(standin, spec, tmp_path):  # noqa: F811
    with Hook(delay_s=0.8) as hook:
        keeper_id, proc = inside_keeper(standin, spec, {"PODGUARD_NOTIFY": hook.url}, popen=True)
        passes(tmp_path)
        say_end(standin.world, live_pod(standin.world), "success", 0)
        code, _, err = finish(proc)
        assert code == 0, err
        ends = [i for i, b in enumerate(hook.bodies) if "job succeeded" in b["text"]]
        assert ends, hook.bodies
        (delete,) = [c for c in standin.calls("DELETE", r"^/v2/pods/") if c.path.endswith(keeper_id)]
        assert hook.answered[ends[0]] <= delete.at  # delivered first, then the pod that sends it goes


# -- 18. a give-up or a refusal leaves no ERROR pod billing ----------------------------------------------------------
def test_a_refusal_terminates_a_pod_in_error_that_still_bills(standin, bare_spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(bare_spec)
    passes(tmp_path)
    pod = live_pod(world)
    world.set_error(pod.id)
    code, _, err = finish(proc)
    assert code == 69, err
    assert pod.status == "TERMINATED" and "cannot stop" in err and not billing(world)


def test_a_give_up_terminates_a_pod_in_error_that_still_bills(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec, "--max-recoveries", "0")
    passes(tmp_path)
    pod = live_pod(world)
    world.set_error(pod.id)
    code, _, err = finish(proc)
    assert code == 75, err
    assert pod.status == "TERMINATED" and not billing(world)


# -- 19. "done" survives a keeper pod's reset container disk ---------------------------------------------------------
def test_a_keeper_pod_whose_disk_was_reset_remembers_done(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    keeper_id, proc = inside_keeper(standin, spec, {"PODGUARD_RETRY_FOR": "0.5"}, popen=True)
    passes(tmp_path)
    pod = live_pod(world)
    standin.fault("DELETE", rf"^/v2/pods/{keeper_id}$", "500", times=1000)  # it cannot terminate itself this time
    say_end(world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0 and pod.status == "EXITED", err
    assert intent(standin)["word"] == "done"
    with standin._lock:
        standin.faults.clear()
    fresh = {"PODGUARD_STATE_DIR": str(tmp_path / "reset-disk")}  # RunPod started it again: an empty container disk
    _, again = inside_keeper_again(standin, spec, keeper_id, fresh)
    assert again.returncode == 0, again.stderr
    assert pod.status == "EXITED" and "start" not in actions(standin, pod.id)  # the finished job is not started
    assert world.pods[keeper_id].status == "TERMINATED" and "is over" in again.stderr


def inside_keeper_again(standin, spec, keeper_id: str, extra: dict[str, str]):  # noqa: F811
    """The keeper pod's container run again, with the env RunPod keeps (the deploy's create body)."""
    (body,) = [json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$") if b"-keeper" in c.body]
    env = {k: v for k, v in body["env"].items() if k != "RUNPOD_API_KEY"}
    full = {**os.environ, **KEEP_FAST, **env, "RUNPOD_POD_ID": keeper_id, "PODGUARD_POLL": POLL, **extra}
    return keeper_id, subprocess.run([*PODGUARD, "pod", "keep"], env=full, capture_output=True, text=True, timeout=60)

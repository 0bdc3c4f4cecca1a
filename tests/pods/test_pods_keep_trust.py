"""`pod keep` the way real nights go (docs/running-pods.md, "Keeping a job alive overnight"): a 502 at
the wrong moment, a keeper killed between two steps, a second actor, a user who changes their mind, a slow image
pull, a webhook that never answers, a resumed pod without GPUs. The real CLI as a process against the stand-in.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from keep_support import (
    CLUSTER_SPEC,
    NETWORK,
    events,
    finish,
    inside_keeper,
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
from standin_state import same_as

from podguard import console


def actions(standin, pod_id: str = "") -> list[str]:  # noqa: F811
    return [json.loads(c.body)["action"] for c in standin.calls("POST", rf"{pod_id}/action$")]


def creates(standin, name: str = "trainer") -> list[dict]:  # noqa: F811
    return [b for b in (json.loads(c.body) for c in standin.calls("POST", r"^/v2/pods$")) if b["name"] == name]


# -- 1. "done" only once the stop is confirmed ---------------------------------------------------------------------
def test_a_stop_answered_502_after_success_is_retried_at_the_next_poll(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec, "--retry-for", "0")
    passes(tmp_path)
    pod = live_pod(standin.world)
    standin.fault("POST", r"/action$", "html502", times=3)  # an outage longer than --retry-for, at the worst moment
    say_end(standin.world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert pod.status == "EXITED" and state(tmp_path)["phase"] == "done"
    assert "the API does not answer" in err and "the job succeeded" in err
    assert len([e for e in events(tmp_path) if e["event"] == "end" and "the job succeeded" in e["text"]]) == 1


def test_a_deployed_keeper_whose_stop_fails_still_stops_the_pod(standin, spec, tmp_path):  # noqa: F811
    def job() -> None:
        passes(tmp_path)
        standin.fault("POST", r"/action$", "html502", times=3, body_contains="stop")
        say_end(standin.world, live_pod(standin.world), "success", 0)

    threading.Thread(target=job, daemon=True).start()
    keeper_id, proc = inside_keeper(standin, spec, {"PODGUARD_RETRY_FOR": "0"})
    assert proc.returncode == 0, proc.stderr
    (pod,) = [p for p in standin.world.pods.values() if p.name == "trainer"]
    assert pod.status == "EXITED", proc.stderr  # not left billing with nobody watching
    assert standin.world.pods[keeper_id].status == "TERMINATED"


def test_a_deployed_keeper_killed_between_the_decision_and_the_stop_makes_the_stop_when_restarted(
    standin,  # noqa: F811
    spec,
    tmp_path,
):
    keeper_id, proc = inside_keeper(standin, spec, {}, popen=True)
    passes(tmp_path)
    pod = live_pod(standin.world)
    standin.fault("POST", rf"{pod.id}/action$", "drop", times=10_000)  # the stop never goes through
    say_end(standin.world, pod, "success", 0)
    wait_for(lambda: actions(standin, pod.id), what="the stop request")
    assert state(tmp_path)["phase"] == "ending"  # the decision is recorded; "done" waits for the stop
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    standin.faults.clear()
    assert pod.status == "RUNNING"
    _, again = inside_keeper(standin, spec, {})  # RunPod restarts the keeper's container
    assert again.returncode == 0, again.stderr
    assert pod.status == "EXITED" and state(tmp_path)["phase"] == "done"
    assert standin.world.pods[keeper_id].status == "TERMINATED"
    assert len(creates(standin)) == 1


# -- 2. never two pods of one name, whoever made the other -------------------------------------------------------
def test_a_pod_of_the_name_made_by_another_actor_is_adopted_not_duplicated(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec, "--notify", "http://127.0.0.1:9/hook")
    passes(tmp_path)
    old = live_pod(world)
    with world.lock:  # the pod breaks and another actor replaces it (`pod heal --replace` copies its env: the mark)
        world.set_error(old.id)
        other = world.create(same_as(old))
    passes(tmp_path, 2)
    wait_for(lambda: live_pods(world) == [other], what="the other actor's pod, kept; the broken one terminated")
    assert old.status == "TERMINATED" and len(creates(standin)) == 1  # the keeper's own first pod only
    assert state(tmp_path)["target_id"] == other.id
    adopted = wait_event(tmp_path, "adopted") + wait_event(tmp_path, "surplus")
    assert any("kept" in e["text"] or "adopted, not duplicated" in e["text"] for e in adopted), adopted
    say_end(world, other, "success", 0)
    assert finish(proc)[0] == 0


def test_a_keeper_started_again_while_another_actor_has_two_pods_of_the_name_keeps_watching(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    proc.send_signal(signal.SIGKILL)  # RunPod restarts a keeper pod's container, a laptop keeper is run again
    proc.wait()
    other = world.create(same_as(old))  # a twin of the keeper's own (a create that landed late, another actor)
    again = keep(spec)
    wait_event(tmp_path, "resume")
    (surplus,) = wait_event(tmp_path, "surplus")  # converged on one: the one the job runs on stays
    assert other.id in surplus["text"] and again.poll() is None, finish(again)[2]  # no reason to end (64) unwatched
    wait_for(lambda: other.status == "TERMINATED", what="the twin terminated")
    assert live_pods(world) == [old] and state(tmp_path)["target_id"] == old.id and len(creates(standin)) == 1
    say_end(world, old, "success", 0)
    assert finish(again)[0] == 0 and old.status == "EXITED"


def test_two_replacements_made_by_other_actors_leave_one_pod_the_oldest(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    with world.lock:  # it breaks; two actors replace it at about the same time (`pod heal --replace` twice)
        world.set_error(old.id)
        first = world.create(same_as(old))
        second = world.create(same_as(old))
        second.created_at = "9" + second.created_at[1:]  # the later createdAt
    passes(tmp_path, 2)
    wait_for(lambda: live_pods(world) == [first], what="one pod of the name, the oldest")
    assert second.status == "TERMINATED" and len(creates(standin)) == 1 and state(tmp_path)["target_id"] == first.id
    say_end(world, first, "success", 0)
    assert finish(proc)[0] == 0


def test_a_keep_from_another_machine_takes_over_and_the_first_keeper_ends_before_acting(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    other_dir = tmp_path / "other-machine"
    first = keep(spec)
    passes(tmp_path)
    elsewhere = {"PODGUARD_STATE_DIR": str(other_dir / "state"), "PODGUARD_KEEPERS_DIR": str(other_dir / "keepers")}
    second = keep(spec, env=elsewhere)  # another machine: its own /tmp and state dir; its word is the newer one
    wait_event(other_dir, "up")
    old = live_pod(world)
    world.set_error(old.id)
    code, _, err = finish(first)  # before its next action it reads the record: a newer keep took over
    assert code == 0 and "generation" in err, err
    passes(other_dir, 2)
    wait_for(lambda: len(live_pods(world)) == 1 and live_pods(world)[0].id != old.id, what="one replacement")
    time.sleep(1.0)
    (new,) = live_pods(world)
    assert state(other_dir)["target_id"] == new.id and len(creates(standin)) == 2
    say_end(world, new, "success", 0)
    assert finish(second)[0] == 0
    assert new.status == "EXITED"


# -- 3 and 5. `pod down` and `pod stop` end the keepers first --------------------------------------------------------
@pytest.mark.parametrize("command", ["down", "stop"])
def test_pod_down_or_stop_during_a_capacity_wait_ends_the_keeper(standin, bare_spec, tmp_path, command):  # noqa: F811
    world = standin.world
    with world.lock:
        saved = dict(world.capacity)
        world.capacity.update({k: -100 for k in world.capacity})
    proc = keep(bare_spec)
    wait_event(tmp_path, "capacity")
    done = pg(["pod", command, "trainer"])
    assert done.returncode == 0, done.stderr
    assert "ending the keeper of trainer" in done.stderr
    code, _, err = finish(proc)
    # pod down writes its word, then SIGTERMs the keeper: it ends by the signal (143), or, when it read the word
    # first, by the word (0); never killed half-way (-15: test_pods_keep_ending.py)
    assert code in (128 + signal.SIGTERM, 0), err
    tries = len(creates(standin))  # the creates refused for capacity
    with world.lock:
        world.capacity.update(saved)
    time.sleep(1.0)
    assert len(creates(standin)) == tries and not live_pods(world)
    assert state(tmp_path)["outcome"] == ("down" if command == "down" else "stopped")


@pytest.mark.parametrize("command", ["down", "stop"])
def test_pod_down_or_stop_while_the_keeper_creates_leaves_nothing_billing(standin, bare_spec, tmp_path, command):  # noqa: F811
    standin.fault("POST", r"^/v2/pods$", "slow", delay=1.5)  # RunPod makes the pod; its answer comes late
    proc = keep(bare_spec)
    wait_for(lambda: creates(standin), what="the keeper's create request")
    done = pg(["pod", command, "trainer"])  # while the create is in flight
    assert done.returncode == 0, done.stderr
    assert finish(proc)[0] == 128 + signal.SIGTERM
    time.sleep(2.0)  # past the create's answer
    assert [p.status for p in live_pods(standin.world)] in ([], ["EXITED"]), done.stderr  # nothing billing


def test_pod_down_ends_a_keeper_of_the_name_under_another_home_and_state_dir(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    other = tmp_path / "other"  # sudo, systemd, tmux: another HOME and state dir on the same machine
    (other / "home").mkdir(parents=True)
    proc = keep(spec, env={"HOME": str(other / "home"), "PODGUARD_STATE_DIR": str(other / "state")})
    passes(other)
    down = pg(["pod", "down", "trainer"])
    assert down.returncode == 0, down.stderr
    assert "ending the keeper of trainer" in down.stderr and str(other / "home") in down.stderr
    assert finish(proc)[0] == 128 + signal.SIGTERM, down.stderr
    time.sleep(1.0)
    assert not live_pods(world) and len(creates(standin)) == 1  # the user's hand wins: nothing made again


def test_pod_stop_of_a_kept_pod_ends_its_keeper_and_pod_start_says_nothing_keeps_it(standin, spec, tmp_path):  # noqa: F811
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(standin.world)
    stopped = pg(["pod", "stop", "trainer"])
    assert stopped.returncode == 0, stopped.stderr
    assert "ending the keeper of trainer" in stopped.stderr and "no longer kept" in stopped.stderr
    assert finish(proc)[0] == 128 + signal.SIGTERM
    time.sleep(0.5)
    assert pod.status == "EXITED" and actions(standin) == ["stop"]  # not started again behind the user's back
    started = pg(["pod", "start", "trainer"])
    assert started.returncode == 0, started.stderr
    assert "nothing keeps it now" in started.stderr and "podguard pod keep --spec" in started.stderr


def test_pod_down_with_no_pod_yet_terminates_the_keeper_pod(standin, spec, tmp_path):  # noqa: F811
    assert pg(["pod", "keep", "--spec", str(spec), "--deploy"]).returncode == 0
    (keeper,) = live_pods(standin.world, "trainer-keeper")
    down = pg(["pod", "down", "trainer"])  # the keeper pod waits for capacity: no pod of the name exists
    assert down.returncode == 0, down.stderr
    assert keeper.status == "TERMINATED" and "its keeper was ended" in down.stderr


# -- 4. a slow boot is not a lost host -------------------------------------------------------------------------------
def test_provisioning_longer_than_the_silence_is_not_a_lost_host(standin, spec, tmp_path):  # noqa: F811
    standin.world.timing.provision_s = 2.5  # the image pull takes longer than the (shortened) 15-minute silence
    proc = keep(spec)
    wait_event(tmp_path, "verdict", text="PASS", timeout=30)
    assert len(creates(standin)) == 1 and not [e for e in events(tmp_path) if e["event"] == "recovery"]
    say_end(standin.world, live_pod(standin.world), "success", 0)
    assert finish(proc)[0] == 0


def test_a_pod_that_never_starts_is_replaced_after_the_ready_timeout(standin, tmp_path):  # noqa: F811
    spec = write_spec(tmp_path / "pod.toml", NETWORK.replace("timeout_s = 30", "timeout_s = 2"))
    world = standin.world
    world.timing.provision_s = 60.0
    proc = keep(spec)
    wait_for(lambda: creates(standin), what="the first create")
    world.timing.provision_s = 0.05  # the replacement boots at once
    (recovery,) = wait_event(tmp_path, "recovery", timeout=30)
    assert "did not start within 2s ([ready] timeout_s): still PROVISIONING" in recovery["text"]
    passes(tmp_path)
    say_end(world, live_pod(world), "success", 0)
    assert finish(proc)[0] == 0
    assert len(creates(standin)) == 2


def test_a_keeper_started_again_still_knows_the_pod_ran_and_replaces_its_lost_host(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    world.lose_host(pod.id)  # while no keeper watched: RUNNING, no runtime, silent
    again = keep(spec)  # the spec's [ready] timeout_s is 30 min: only the (1 s) silence rule can see the lost host
    (recovery,) = wait_event(tmp_path, "recovery", timeout=15)
    assert "its host is lost" in recovery["text"], recovery["text"]
    passes(tmp_path, 2)
    say_end(world, live_pod(world), "success", 0)
    assert finish(again)[0] == 0


def test_a_pod_that_vanishes_just_before_its_start_is_replaced_not_the_end_of_the_keeper(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    maintenance(world, pod)
    world.before_action = lambda p: setattr(p, "status", "TERMINATED")  # gone between the poll and the start
    passes(tmp_path, 2)  # the next poll sees it gone: a replacement, not an exit (66) with nothing watching
    (new,) = live_pods(world)
    assert new.id != pod.id and len(creates(standin)) == 2
    say_end(world, new, "success", 0)
    assert finish(proc)[0] == 0


def test_a_pod_gone_just_before_the_final_stop_ends_the_keep_as_done(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    pod = live_pod(world)
    world.before_action = lambda p: setattr(p, "status", "TERMINATED")  # gone between the read and the stop
    say_end(world, pod, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err
    assert state(tmp_path)["phase"] == "done" and "is gone" in err


def test_a_start_whose_answer_is_lost_is_not_taken_for_a_lost_host(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec, "--retry-for", "0.2")
    passes(tmp_path)
    pod = live_pod(world)
    world.timing.start_s = 2.0  # its container takes a while to start
    standin.fault("POST", r"/action$", "html502", times=10_000, body_contains="start")
    maintenance(world, pod)
    wait_for(lambda: standin.calls("POST", r"/action$"), what="a start request")
    time.sleep(1.5)  # EXITED for longer than the (shortened) silence: its last line is old
    standin.faults.clear()
    standin.fault("POST", r"/action$", "lost", times=10_000, body_contains="start")  # started, the answer lost
    wait_for(lambda: pod.status != "EXITED", what="the start")
    passes(tmp_path, 2)
    standin.faults.clear()
    assert len(creates(standin)) == 1 and pod.status == "RUNNING"  # not replaced as if its host were lost
    assert not [e for e in events(tmp_path) if "host is lost" in e["text"]]
    say_end(world, pod, "success", 0)
    assert finish(proc)[0] == 0


# -- 6. a keeper pod that cannot start stops itself -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"PODGUARD_POLL": "0"}, "--poll 0 is not valid"),
        ({"PODGUARD_MAX_RECOVERIES": "two"}, "--max-recoveries 'two' is not valid"),
        ({"PODGUARD_NOTIFY": "{{ RUNPOD_SECRET_hook }}"}, "RunPod did not fill in that secret"),
    ],
)
def test_a_keeper_pod_with_a_bad_option_or_an_unfilled_secret_stops_itself(standin, spec, tmp_path, env, says):  # noqa: F811
    keeper_id, proc = inside_keeper(standin, spec, {**env, "PODGUARD_KEEP_PARK_S": "20"})
    assert proc.returncode == 64, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert standin.world.pods[keeper_id].status == "EXITED"  # stopped: no crash loop, its log says why
    assert creates(standin) == []


# -- 7. a webhook that never answers ------------------------------------------------------------------------------
class SilentHook:
    """A webhook that reads each post and never answers (`trickle`: answers a byte at a time, never finishing)."""

    def __init__(self, *, trickle: bool = False) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.bodies.append(json.loads(raw))
                if not trickle:
                    hook.release.wait(30)
                    return
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not hook.release.wait(0.2):  # every read gets a byte within its timeout
                    self.wfile.write(b"z")
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_the_end_message_is_tried_even_when_the_webhook_never_answers(standin, spec, tmp_path):  # noqa: F811
    hook = SilentHook()
    try:
        proc = keep(spec, "--notify", hook.url, env={"PODGUARD_KEEP_NOTIFY_S": "1"})
        passes(tmp_path)
        pod = live_pod(standin.world)
        maintenance(standin.world, pod)  # a recovery message: its post hangs
        passes(tmp_path, 2)
        say_end(standin.world, pod, "success", 0)
        ended = time.monotonic()
        code, _, err = finish(proc)
        took = time.monotonic() - ended
        assert code == 0, err
        assert any("the job succeeded" in b["text"] for b in hook.bodies), hook.bodies
        assert took < 6.0, f"{took:.1f}s"
    finally:
        hook.close()


def test_a_webhook_that_answers_a_byte_at_a_time_costs_each_message_its_deadline_only():
    from podguard.pods.keeper.notify import Notifier

    hook = SilentHook(trickle=True)
    notifier = Notifier(hook.url, scrub=lambda t: t, deadline_s=1.0)
    try:
        with console.captured() as warnings:  # the notifier's threads warn through the console
            notifier.send("recovery 1")
            notifier.send("recovery 2")
            wait_for(
                lambda: len(hook.bodies) == 2, timeout=4.0, what="the second message, one deadline after the first"
            )
            notifier.close()
        assert any(w.startswith("podguard: warning: ") and "failed" in w for w in warnings), warnings
    finally:
        hook.close()


# -- a resumed pod without GPUs is the host's problem ------------------------------------------------------------------
def test_a_pod_resumed_with_zero_gpus_is_replaced(standin, spec, tmp_path):  # noqa: F811
    world = standin.world
    proc = keep(spec)
    passes(tmp_path)
    old = live_pod(world)
    world.gpus_on_start = 0  # RunPod resumes it on a host whose GPUs were rented meanwhile
    maintenance(world, old)
    wait_event(tmp_path, "recovery", 2)
    world.gpus_on_start = None
    passes(tmp_path, 2)
    new = live_pod(world)
    assert new.id != old.id and new.gpu_count == 2
    replace = wait_event(tmp_path, "recovery", 2)[1]["text"]
    assert "GPU" in replace and "the host, not the job" in replace, replace
    say_end(world, new, "success", 0)
    code, _, err = finish(proc)
    assert code == 0, err


# -- notifications name the checkpoint the job comes back from ---------------------------------------------------------
def test_a_recovery_notification_names_the_checkpoint_and_its_age(standin, spec, tmp_path):  # noqa: F811
    from hook_support import Hook

    written = datetime.fromtimestamp(time.time() - 14 * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with Hook() as hook:
        proc = keep(spec, "--notify", hook.url)
        passes(tmp_path)
        pod = live_pod(standin.world)
        detail = f"received SIGTERM; newest checkpoint /workspace/ckpt/checkpoint-1200 (step 1200, written {written})"
        say_end(standin.world, pod, "signal", 143, detail=detail)
        time.sleep(0.05)
        standin.world.act(pod.id, "stop")
        passes(tmp_path, 2)
        say_end(standin.world, pod, "success", 0)
        assert finish(proc)[0] == 0
        posts = wait_for(lambda: hook.bodies if len(hook.bodies) >= 2 else None, what="two posts")
    recovery = posts[0]["text"]
    assert "comes back from checkpoint-1200 (step 1200), work since 14m" in recovery, recovery
    assert "checkpoint" not in posts[-1]["text"]


def test_a_keeper_killed_between_reading_the_end_line_and_acting_on_it_reads_it_again(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec, env={"PODGUARD_KEEP_SETTLE_S": "5"})  # a node's failure: the other nodes' lines first, 5 s
    passes(tmp_path, 2, name="ring")
    (cluster,) = world.clusters.values()
    say_end(world, world.pods[cluster.members[1]], "failed", 1, detail="rank 3 exited 1")
    wait_event(tmp_path, "end", text="END failed", name="ring")
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)  # the line was read; the end it calls for is not decided yet
    proc.wait()
    assert world.clusters, "nothing was deleted yet"
    again = keep(spec)
    code, _, err = finish(again)
    assert code == 1, err
    assert world.clusters == {} and len(standin.calls("POST", r"^/v2/clusters$")) == 1


def test_a_cluster_of_the_name_made_by_another_actor_is_adopted_before_a_recreate(standin, tmp_path):  # noqa: F811
    world = standin.world
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC)
    proc = keep(spec)
    passes(tmp_path, 2, name="ring")
    (first,) = world.clusters.values()
    with world.lock:  # a node breaks, and another actor recreates the cluster (`pod heal ring --replace`)
        world.set_error(first.members[1])
        other = world.create_cluster(
            {
                "name": "ring",
                "type": "TRAINING",
                "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 2, "podCount": 2},
                "image": "registry.example/me/podguard:0.2",
                "args": "train --mode torchrun -- python train.py",
                "env": dict(world.pods[first.members[0]].env),  # the heal copies the env: podguard's mark
                "dataCenterIds": [first.dc],
            }
        )
    passes(tmp_path, 4, name="ring")
    assert list(world.clusters) == [other.id] and len(standin.calls("POST", r"^/v2/clusters$")) == 1
    events = wait_event(tmp_path, "surplus", name="ring") + wait_event(tmp_path, "adopted", name="ring")
    assert any(first.id in e["text"] for e in events), events
    say_end(world, world.pods[other.members[0]], "success", 0)
    assert finish(proc)[0] == 0 and world.clusters == {}

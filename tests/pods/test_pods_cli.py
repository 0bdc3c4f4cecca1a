"""`podguard pod …` as a subprocess against the stand-in API: up, readiness, lifecycle, logs, the key."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time

import pytest
from pods_support import A40_SPEC, KEY, PODGUARD, pg, standin, write_spec  # noqa: F401 (fixture)


@pytest.fixture
def spec(tmp_path):
    return write_spec(tmp_path / "pod.toml", A40_SPEC)


def up(spec, *extra: str) -> subprocess.CompletedProcess[str]:
    return pg(["pod", "up", "--spec", str(spec), "--json", *extra])


def test_pod_up_twice_creates_one_pod_and_reports_it(standin, spec):  # noqa: F811
    first, second = up(spec), up(spec)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert (a["action"], b["action"]) == ("created", "reused") and a["id"] == b["id"]
    assert len(standin.world.pods) == 1 and len(standin.calls("POST", r"^/v2/pods$")) == 1
    assert a["status"] == "RUNNING" and a["ready"] is True and a["verdict"] == "PASS"
    assert a["gpu"] == {"type": "NVIDIA A40", "count": 2} and a["cost_per_hr"] == 0.88
    assert (
        a["ssh"].startswith("ssh root@")
        and {"private": 22, "public": a["ports"][0]["public"], "type": "tcp", "ip": "203.0.113.7"} in a["ports"]
    )
    body = json.loads(standin.calls("POST", r"^/v2/pods$")[0].body)
    assert body["startSsh"] is True and body["gpu"] == {"id": "NVIDIA A40", "count": 2} and body["env"]


def test_an_exited_pod_is_started_by_pod_up(standin, spec):  # noqa: F811
    assert up(spec).returncode == 0
    (pod,) = standin.world.pods.values()
    standin.world.act(pod.id, "stop")
    proc = up(spec)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["action"] == "started" and pod.starts == 2


def test_capacity_falls_back_to_the_next_gpu_type_then_the_next_data_centre(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.capacity.clear()
    world.set_capacity("NVIDIA A40", 8, dc="US-KS-2")
    world.set_capacity("NVIDIA A100 80GB PCIe", 8, dc="US-KS-2")
    spec = write_spec(
        tmp_path / "p.toml", A40_SPEC.replace("ports =", 'data_centers = ["EU-RO-1", "US-KS-2"]\nports =')
    )
    proc = up(spec)
    assert proc.returncode == 0, proc.stderr
    tried = [(b["gpu"]["id"], b["dataCenterIds"][0]) for b in (json.loads(c.body) for c in standin.calls("POST"))]
    assert tried == [("NVIDIA A40", "EU-RO-1"), ("NVIDIA A100 80GB PCIe", "EU-RO-1"), ("NVIDIA A40", "US-KS-2")]
    assert json.loads(proc.stdout)["gpu"]["type"] == "NVIDIA A40"


def test_no_capacity_anywhere_is_69_listing_what_was_tried(standin, spec):  # noqa: F811
    standin.world.capacity.clear()
    proc = up(spec)
    assert proc.returncode == 69, proc.stderr
    assert "2x NVIDIA A40 in any data centre" in proc.stderr and "2x NVIDIA A100 80GB PCIe" in proc.stderr
    assert standin.world.pods == {}


def test_a_lost_create_answer_does_not_create_a_duplicate(standin, spec):  # noqa: F811
    standin.fault("POST", r"^/v2/pods$", "lost")
    proc = up(spec)
    assert proc.returncode == 0, proc.stderr
    assert len(standin.world.pods) == 1 and len(standin.calls("POST", r"^/v2/pods$")) == 1
    assert "exists" in proc.stderr


def test_429_502_500_and_dropped_connections_are_retried_and_pod_up_succeeds(standin, spec):  # noqa: F811
    standin.fault("GET", r"^/v2/pods$", "429")
    standin.fault("POST", r"^/v2/pods$", "html502")
    standin.fault("GET", r"^/v2/pods/[^/]+$", "drop")
    standin.fault("GET", r"^/v2/pods/[^/]+$", "500")
    standin.fault("GET", r"/logs$", "html502")
    proc = up(spec)
    assert proc.returncode == 0, proc.stderr
    assert len(standin.world.pods) == 1
    assert all(f.times == 0 for f in standin.faults)


def test_readiness_comes_from_the_log_line_not_from_the_status(standin, spec):  # noqa: F811
    """RUNNING is not ready: `pod up` returns only once the PASS line is in the pod's log, and soon after."""
    standin.world.timing.verdict_delay_s = 1.5
    started = time.monotonic()
    proc = up(spec)
    assert proc.returncode == 0, proc.stderr
    (pod,) = standin.world.pods.values()
    passed_at = next(e for e in pod.logs if "PASS" in e.line)
    assert time.monotonic() - started >= 1.5
    assert not standin.calls("GET", r"/logs$")[0].target.count("tail=")  # followed from the pod's start
    assert "since=" in standin.calls("GET", r"/logs$")[0].target
    assert passed_at.line in json.loads(proc.stdout)["preflight"]


def test_an_unhealthy_preflight_fails_pod_up_with_76_and_the_pods_own_lines(standin, spec):  # noqa: F811
    standin.world.new_machine_health = ["broken"]
    proc = up(spec)
    assert proc.returncode == 76, proc.stderr
    assert "preflight UNHEALTHY" in proc.stderr and "GPU3 UNHEALTHY: XID 79" in proc.stderr
    assert "left running for inspection" in proc.stderr and "podguard pod down trainer" in proc.stderr
    (pod,) = standin.world.pods.values()
    assert pod.status == "RUNNING"
    assert json.loads(proc.stdout)["ready"] is False


def test_the_newest_verdict_since_the_start_counts(standin, spec):  # noqa: F811
    standin.world.script = lambda pod: ["podguard train: PASS on 2 GPU(s)", "podguard train: UNHEALTHY on 2 GPU(s)"]
    assert up(spec).returncode == 76


def test_no_verdict_within_the_timeout_is_75(standin, spec):  # noqa: F811
    standin.world.script = lambda pod: ["a container that is not podguard"]
    proc = up(spec, "--timeout", "0.8")
    assert proc.returncode == 75 and "no preflight verdict" in proc.stderr


def test_no_wait_returns_once_the_pod_exists(standin, spec):  # noqa: F811
    standin.world.timing.provision_s = 30
    proc = up(spec, "--no-wait")
    assert proc.returncode == 0 and json.loads(proc.stdout)["status"] == "PROVISIONING"


def test_lifecycle_commands_are_idempotent_and_refusals_name_allowed_actions(standin, spec):  # noqa: F811
    assert up(spec).returncode == 0
    assert pg(["pod", "stop", "trainer"]).returncode == 0
    again = pg(["pod", "stop", "trainer"])
    assert again.returncode == 0 and "already EXITED" in again.stderr
    refused = pg(["pod", "restart", "trainer"])
    assert refused.returncode == 64
    assert "EXITED: restart is not allowed; allowed: start, down" in refused.stderr
    assert pg(["pod", "start", "trainer"]).returncode == 0
    assert "already" in pg(["pod", "start", "trainer"]).stderr
    assert pg(["pod", "down", "trainer"]).returncode == 0
    gone = pg(["pod", "down", "trainer"])
    assert gone.returncode == 0 and "nothing to take down" in gone.stderr
    assert len(standin.calls("POST", r"/action$")) == 2 and len(standin.calls("DELETE")) == 1


def test_a_409_from_the_api_becomes_a_one_line_refusal(standin, spec):  # noqa: F811
    """The listing said RUNNING, but the pod stopped before the action arrived: RunPod answers 409."""
    assert up(spec).returncode == 0
    (pod,) = standin.world.pods.values()
    standin.world.before_action = lambda p: setattr(p, "status", "EXITED")
    proc = pg(["pod", "restart", pod.id])
    assert proc.returncode == 64, proc.stderr
    assert "EXITED: restart is not allowed; allowed: start, down" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_host_full_on_start_is_69_with_a_hint(standin, spec):  # noqa: F811
    assert up(spec).returncode == 0
    assert pg(["pod", "stop", "trainer"]).returncode == 0
    standin.world.host_full_on_start = True
    proc = pg(["pod", "start", "trainer"])
    assert proc.returncode == 69 and "not enough free GPUs on the host" in proc.stderr
    assert "podguard pod heal trainer --replace" in proc.stderr


def test_status_list_and_unknown_pods(standin, spec):  # noqa: F811
    assert pg(["pod", "list", "--json"]).stdout.strip() == "[]"
    assert up(spec).returncode == 0
    listed = json.loads(pg(["pod", "list", "--json"]).stdout)
    assert [p["name"] for p in listed] == ["trainer"]
    table = pg(["pod", "list"]).stdout
    assert "trainer" in table and "2x NVIDIA A40" in table and "$0.88/hr" in table
    status = json.loads(pg(["pod", "status", listed[0]["id"], "--json"]).stdout)
    assert {"id", "name", "status", "gpu", "cost_per_hr", "ssh", "ports"} <= set(status)
    missing = pg(["pod", "status", "nope"])
    assert missing.returncode == 66 and "no pod named 'nope'" in missing.stderr


def test_logs_tail_prints_recent_lines_and_exits_follow_keeps_streaming(standin, spec):  # noqa: F811
    assert up(spec).returncode == 0
    (pod,) = standin.world.pods.values()
    for i in range(5):
        standin.world.emit(pod.id, f"step {i}")
    proc = pg(["pod", "logs", "trainer", "--tail", "3"])
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["step 2", "step 3", "step 4"]
    follow = subprocess.Popen(
        [*PODGUARD, "pod", "logs", "trainer", "--tail", "1", "--follow"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert follow.stdout is not None and follow.stdout.readline() == "step 4\n"
        standin.world.emit(pod.id, "live line")
        assert follow.stdout.readline() == "live line\n"
    finally:
        follow.terminate()
        follow.wait(10)


def test_the_key_is_never_in_a_url_an_output_or_a_record(standin, spec, tmp_path):  # noqa: F811
    standin.world.new_machine_health = ["sick"]
    outputs = [up(spec), pg(["pod", "list", "--json"]), pg(["pod", "heal", "trainer", "--json"])]
    outputs.append(pg(["pod", "logs", "trainer", "--json"]))
    assert outputs[2].returncode == 0, outputs[2].stderr
    for proc in outputs:
        assert KEY not in proc.stdout and KEY not in proc.stderr
    for rec in standin.requests:
        assert KEY not in rec.target and KEY.encode() not in rec.body
    records = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert records and all(KEY not in p.read_text() for p in records)


def test_a_missing_key_is_77_naming_where_it_is_read_from_and_sends_nothing(standin, spec):  # noqa: F811
    import os

    env = {k: v for k, v in os.environ.items() if k != "RUNPOD_API_KEY"}
    proc = subprocess.run([*PODGUARD, "pod", "list"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 77
    assert "RUNPOD_API_KEY" in proc.stderr and ".runpod/config.toml" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and standin.requests == []
    rejected = pg(["pod", "up", "--spec", str(spec)], env={"RUNPOD_API_KEY": "rpa_NOTTHEKEYnotthekeyNOTTHEKEY00"})
    assert rejected.returncode == 77 and "NOTTHEKEY" not in rejected.stderr


def test_graphql_cli_path_and_spot_specs(standin, tmp_path):  # noqa: F811
    spot = write_spec(
        tmp_path / "spot.toml", A40_SPEC.replace("[gpu]", "interruptible = true\nbid_per_gpu = 0.5\n[gpu]")
    )
    proc = up(spot)
    assert proc.returncode == 0, proc.stderr
    assert any(b"podRentInterruptable" in c.body for c in standin.calls("POST", r"^/graphql$"))
    (pod,) = standin.world.pods.values()
    assert pod.interruptible and pod.bid == 0.5
    listed = pg(["pod", "list", "--json", "--api", "graphql"])
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["id"] == pod.id
    assert pg(["pod", "up", "--spec", str(spot), "--api", "rest"]).returncode == 64
    assert pg(["pod", "list", "--api", "soap"]).returncode == 64
    cpu = write_spec(tmp_path / "cpu.toml", 'name = "c"\nimage = "i"\n[cpu]\nid = "cpu3c"\nvcpus = 4\n')
    before = len(standin.requests)
    assert pg(["pod", "up", "--spec", str(cpu), "--api", "graphql"]).returncode == 64
    assert len(standin.requests) == before


@pytest.mark.parametrize("argv", [["pod", "list", "--json"], ["gpus", "--json"], ["train", "--help"]])
def test_commands_that_need_no_graphql_never_import_the_sdk(standin, argv):  # noqa: F811
    code = (
        "import sys\nfrom podguard.cli.app import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('SDK' if 'runpod' in sys.modules else 'no SDK', file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip().splitlines()[-1] == "no SDK", proc.stderr


def test_on_a_terminal_the_status_line_is_rewritten_in_place_and_ended_before_the_next_line(standin, spec):  # noqa: F811
    """stderr a terminal: `pod NAME (ID): STATUS, Ns` is one line rewritten in place (console.status), and it never
    runs into the next line (`... is RUNNING; following its log`); stdout keeps the result alone."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*PODGUARD, "pod", "up", "--spec", str(spec), "--json"],
            stdout=subprocess.PIPE,
            stderr=terminal,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        os.close(terminal)
        terminal = -1
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the command ended and closed its end of the terminal
                break
            if not chunk:
                break
            shown += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    text = shown.decode().replace("\r\n", "\n")  # the terminal's own newline translation
    assert proc.returncode == 0, text
    assert json.loads(out)["ready"] is True
    assert re.search(r"\r\x1b\[Kpodguard: pod trainer \(\w+\): (PROVISIONING|STARTING|RUNNING), \d+s", text), text
    running = text.index("podguard: pod trainer (")
    following = text.index("is RUNNING; following its log")
    line_start = text.rindex("podguard: ", 0, following)
    assert line_start > running and text[line_start - 1] == "\n", repr(text)  # the status line was ended first

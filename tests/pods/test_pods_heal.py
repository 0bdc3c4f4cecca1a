"""`podguard pod heal`: the ladder step by step against the stand-in (restart, stop+start, --replace)."""

from __future__ import annotations

import json
import subprocess

import pytest
from pods_support import A40_SPEC, pg, standin, write_spec  # noqa: F401 (fixture)

NETWORK = A40_SPEC.replace("[env]", '[network_volume]\nid = "vol-1"\npath = "/workspace"\n\n[env]')


@pytest.fixture
def sick_pod(standin, tmp_path):  # noqa: F811
    """A pod that passed once; then its machine turns `sick` (driver state) or `broken` (hardware)."""

    def make(health: str, spec_text: str = A40_SPEC):  # type: ignore[no-untyped-def]
        spec = write_spec(tmp_path / "pod.toml", spec_text)
        assert pg(["pod", "up", "--spec", str(spec)]).returncode == 0
        (pod,) = standin.world.pods.values()
        pod.machine.health = health
        return pod

    return make


def heal(*extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = pg(["pod", "heal", "trainer", "--json", "--timeout", "10", *extra])
    return proc, (json.loads(proc.stdout)["heal"] if proc.stdout.strip() else {})


def steps(record: dict) -> list[tuple[str, str]]:
    return [(s["step"], s["result"]) for s in record["steps"]]


def test_stop_start_heals_what_a_restart_did_not(standin, sick_pod, tmp_path):  # noqa: F811
    pod = sick_pod("sick")
    proc, record = heal()
    assert proc.returncode == 0, proc.stderr
    assert steps(record) == [("restart", "fail"), ("stop+start", "pass")]
    assert [c.body for c in standin.calls("POST", r"/action$")] == [
        b'{"action": "restart"}',
        b'{"action": "stop"}',
        b'{"action": "start"}',
    ]
    assert "heal step 1: restart" in proc.stderr and "heal step 2: stop, then start" in proc.stderr
    saved = list((tmp_path / "state" / "heal").glob(f"*-{pod.id}.json"))
    assert len(saved) == 1 and steps(json.loads(saved[0].read_text())) == steps(record)


def test_a_restart_that_does_nothing_is_noticed_and_the_ladder_goes_on(standin, sick_pod):  # noqa: F811
    sick_pod("sick")
    standin.world.ignore_restart = True
    proc, record = heal()
    assert proc.returncode == 0, proc.stderr
    assert steps(record) == [("restart", "no-effect"), ("stop+start", "pass")]


def test_a_full_host_without_replace_is_69_and_says_how_to_move_it(standin, sick_pod):  # noqa: F811
    sick_pod("broken")
    standin.world.host_full_on_start = True
    proc, record = heal()
    assert proc.returncode == 69, proc.stderr
    assert steps(record) == [("restart", "fail"), ("stop+start", "host-full")]
    assert "--replace" in proc.stderr and len(standin.world.pods) == 1


def test_replace_moves_the_pod_keeping_name_image_env_gpu_and_network_volume(standin, sick_pod):  # noqa: F811
    old = sick_pod("broken", NETWORK)
    standin.world.host_full_on_start = True
    standin.world.new_machine_health = ["ok"]
    proc, record = heal("--replace")
    assert proc.returncode == 0, proc.stderr
    assert steps(record) == [("restart", "fail"), ("stop+start", "host-full"), ("replace", "pass")]
    new = standin.world.pods[record["result_pod"]]
    assert new.id != old.id and old.status == "TERMINATED" and new.status == "RUNNING"
    same = ("name", "image", "args", "env", "ports", "gpu_type", "gpu_count", "mounts")
    assert {k: getattr(new, k) for k in same} == {k: getattr(old, k) for k in same}
    assert new.machine.dc == old.machine.dc  # a network volume lives in one data centre


def test_a_replacement_that_also_fails_is_removed_and_the_sick_pod_kept(standin, sick_pod):  # noqa: F811
    old = sick_pod("broken")
    standin.world.new_machine_health = ["broken"]
    proc, record = heal("--replace")
    assert proc.returncode == 76, proc.stderr
    assert steps(record) == [("restart", "fail"), ("stop+start", "fail"), ("replace", "fail")]
    assert old.status == "RUNNING"
    assert [p.status for p in standin.world.pods.values() if p.id != old.id] == ["TERMINATED"]


def test_an_exited_pod_skips_the_restart(standin, sick_pod):  # noqa: F811
    pod = sick_pod("sick")
    standin.world.act(pod.id, "stop")
    proc, record = heal()
    assert proc.returncode == 0, proc.stderr
    assert steps(record) == [("restart", "skipped"), ("stop+start", "pass")]


def test_a_replacement_carries_podguards_mark_its_own_or_a_new_one_for_its_name():
    from podguard.pods.clusters.cluster import Cluster, Member
    from podguard.pods.clusters.heal import replacement_cluster
    from podguard.pods.heal import replacement_request
    from podguard.pods.mark import ENV_MARK, mark_of, name_hash
    from podguard.pods.pod import GpuInfo, Pod, PodStatus

    def made(env: dict[str, str]) -> Pod:
        return Pod("p1", "trainer", PodStatus.RUNNING, GpuInfo("NVIDIA A40", 2), 0.9, None, (), (), env=env)

    bare = replacement_request(made({"A": "1"}))  # a pod made by hand: its replacement is podguard's
    assert mark_of(bare.env).name == name_hash("trainer") and mark_of(bare.env).keep == "heal" and bare.env["A"] == "1"
    own = {"A": "1", ENV_MARK: "podguard/1 name=x keep=k7-ab spec=s gpus=2"}
    assert replacement_request(made(own)).env[ENV_MARK] == own[ENV_MARK]  # the keep's own pod stays the keep's
    cluster = Cluster("c1", "trainer", "TRAINING", GpuInfo("NVIDIA A40", 2), 2)
    request = replacement_cluster(cluster, [Member(made({"A": "1"}), 0)])
    assert mark_of(request.env).keep == "heal" and mark_of(request.env).gpus == 2

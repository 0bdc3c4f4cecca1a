"""`podguard pod …` on RunPod Instant Clusters, as a subprocess against the stand-in's `/v2/clusters` (real HTTP).

Each member pod of the stand-in runs a preflight on its own machine and writes its summary line to its own
log; the machine's health (or a scripted line) decides the verdict, so "node 1 is UNHEALTHY" is node 1's
own log line that `pod up` has to find on node 1's stream.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import urlsplit
from urllib.request import Request, urlopen

import pytest
from pods_support import A40_SPEC, PODGUARD, pg, standin, write_spec  # noqa: F401 (fixture)

from podguard.pods.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SPEC = """
    name = "ring"
    image = "registry.example/me/podguard:0.2"
    args = "train --mode torchrun -- python train.py"
    ports = ["22/tcp", "8888/http"]

    [gpu]
    types = ["NVIDIA A40", "NVIDIA A100 80GB PCIe"]
    count = 2

    [cluster]
    nodes = {nodes}

    [env]
    WANDB_PROJECT = "demo"

    [ready]
    timeout_s = 30
"""
PASS = ["podguard train: PASS on 2 GPU(s) in 842 ms"]
UNHEALTHY = [
    "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms",
    "  GPU1 UNHEALTHY: uncorrected ECC errors (volatile DRAM)",
]


def cluster_spec(tmp_path: Path, nodes: int = 2, extra: str = "") -> Path:
    return write_spec(tmp_path / f"cluster-{nodes}.toml", CLUSTER_SPEC.format(nodes=nodes) + extra)


def up(spec: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return pg(["pod", "up", "--spec", str(spec), "--json", *extra])


def creates(standin) -> list[dict]:  # noqa: F811
    return [json.loads(c.body) for c in standin.calls("POST", r"^/v2/clusters$")]


@pytest.mark.parametrize("nodes", [2, 4])
def test_pod_up_creates_one_cluster_and_waits_for_every_nodes_pass(standin, tmp_path, nodes):  # noqa: F811
    proc = up(cluster_spec(tmp_path, nodes))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(creates(standin)) == 1 and standin.calls("POST", r"^/v2/pods$") == []
    body = creates(standin)[0]
    assert body["compute"] == {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 2, "podCount": nodes}
    assert body["type"] == "TRAINING" and body["startSsh"] is True and "registry" not in body
    (cluster,) = standin.world.clusters.values()
    members = standin.world.members(cluster)
    assert out["id"] == cluster.id and out["name"] == "ring" and out["nodes"] == nodes and out["status"] == "RUNNING"
    assert out["action"] == "created" and out["ready"] is True and out["verdict"] == "PASS"
    assert out["verdicts"] == {f"node{r}": "PASS" for r in range(nodes)}
    assert out["gpu"] == {"type": "NVIDIA A40", "count": 2} and out["cost_per_hr"] == pytest.approx(0.88 * nodes)
    assert [m["rank"] for m in out["members"]] == list(range(nodes))
    assert {m["id"] for m in out["members"]} == {p.id for p in members}
    assert all(m["status"] == "RUNNING" and m["gpu"] == {"type": "NVIDIA A40", "count": 2} for m in out["members"])
    assert out["ssh"] == out["members"][0]["ssh"] and out["ssh"].startswith("ssh root@")
    # every node's PASS line was in its own log, and each node's log was followed on its own stream
    assert all(any("PASS" in e.line for e in p.logs) for p in members)
    streamed = {re.match(r"^/v2/pods/([^/]+)/logs$", c.path).group(1) for c in standin.calls("GET", r"/logs$")}
    assert streamed == {p.id for p in members}
    # status polls while waiting: the cluster's aggregate, never one GET per node
    assert standin.calls("GET", r"^/v2/pods/[^/]+$") == []
    assert standin.calls("GET", r"^/v2/clusters/[^/]+$")


def test_one_unhealthy_node_is_76_naming_its_rank_and_lines(standin, tmp_path):  # noqa: F811
    standin.world.script = lambda pod: UNHEALTHY if pod.rank == 2 else PASS
    started = time.monotonic()
    proc = up(cluster_spec(tmp_path, 4))
    assert proc.returncode == 76, proc.stderr
    assert time.monotonic() - started < 20
    assert "node2 UNHEALTHY" in proc.stderr and "node2: podguard train: UNHEALTHY" in proc.stderr
    assert "node2:   GPU1 UNHEALTHY: uncorrected ECC" in proc.stderr and "node1 UNHEALTHY" not in proc.stderr
    assert "pod down ring" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["ready"] is False and out["verdict"] == "UNHEALTHY" and out["failed_nodes"] == [2]
    assert len(standin.world.clusters) == 1  # left running for inspection


def test_no_capacity_for_all_nodes_on_the_first_type_moves_the_whole_cluster_to_the_second(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.capacity.clear()
    world.set_capacity("NVIDIA A40", 6)  # room for 3 of the 4 nodes in every data centre: not enough
    world.set_capacity("NVIDIA A100 80GB PCIe", 8, dc="US-KS-2")
    proc = up(cluster_spec(tmp_path, 4))
    assert proc.returncode == 0, proc.stderr
    assert [b["compute"]["gpuTypeId"] for b in creates(standin)] == ["NVIDIA A40", "NVIDIA A100 80GB PCIe"]
    out = json.loads(proc.stdout)
    assert out["gpu"]["type"] == "NVIDIA A100 80GB PCIe" and out["data_center"] == "US-KS-2"
    assert {m["data_center"] for m in out["members"]} == {"US-KS-2"} and len(world.clusters) == 1


def test_no_capacity_anywhere_is_69_and_creates_nothing(standin, tmp_path):  # noqa: F811
    standin.world.capacity.clear()
    proc = up(cluster_spec(tmp_path, 2))
    assert proc.returncode == 69, proc.stderr
    assert "2 nodes x 2x NVIDIA A40" in proc.stderr and "2 nodes x 2x NVIDIA A100 80GB PCIe" in proc.stderr
    assert standin.world.clusters == {} and standin.world.pods == {}


def test_a_lost_create_answer_still_makes_one_cluster(standin, tmp_path):  # noqa: F811
    standin.fault("POST", r"^/v2/clusters$", "lost")
    proc = up(cluster_spec(tmp_path, 2))
    assert proc.returncode == 0, proc.stderr
    assert len(standin.world.clusters) == 1 and len(creates(standin)) == 1
    assert "the create answer was lost, but cluster ring exists" in proc.stderr


def test_pod_up_twice_reuses_the_cluster(standin, tmp_path):  # noqa: F811
    spec = cluster_spec(tmp_path, 2)
    first, second = up(spec), up(spec)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert (a["action"], b["action"]) == ("created", "reused") and a["id"] == b["id"]
    assert len(standin.world.clusters) == 1 and len(creates(standin)) == 1


def test_status_list_and_logs_of_a_cluster(standin, tmp_path):  # noqa: F811
    assert up(cluster_spec(tmp_path, 2)).returncode == 0
    assert pg(["pod", "up", "--spec", str(write_spec(tmp_path / "pod.toml", A40_SPEC))]).returncode == 0
    (cluster,) = standin.world.clusters.values()
    status = json.loads(pg(["pod", "status", "ring", "--json"]).stdout)
    assert status["id"] == cluster.id and status["nodes"] == 2 and [m["rank"] for m in status["members"]] == [0, 1]
    for member in status["members"]:  # billing: each node's own estimate, and the cluster's sum of them
        standin.world.backdate(member["id"], 3600)
    spent = json.loads(pg(["pod", "status", "ring", "--json"]).stdout)
    assert spent["uptime_s"] >= 3600 and spent["spent_usd"] == pytest.approx(1.76, abs=0.01)
    assert sum(m["spent_usd"] for m in spent["members"]) == pytest.approx(spent["spent_usd"], abs=0.001)
    assert "spent:    $1.76" in pg(["pod", "status", "ring"]).stdout
    assert "node1:" in pg(["pod", "status", cluster.id]).stdout
    waited = pg(["pod", "wait", "ring", "--json"])
    assert waited.returncode == 0 and json.loads(waited.stdout)["ready"] is True, waited.stderr
    listed = json.loads(pg(["pod", "list", "--json"]).stdout)
    assert sorted(item["name"] for item in listed) == ["ring", "trainer"]  # members are not separate items
    assert next(item for item in listed if item["name"] == "ring")["nodes"] == 2
    table = pg(["pod", "list"]).stdout
    assert "2 nodes x 2x NVIDIA A40" in table and "$1.76/hr" in table and len(table.splitlines()) == 3
    every = pg(["pod", "logs", "ring", "--tail", "5"])
    assert every.returncode == 0, every.stderr
    assert {line.split(":", 1)[0] for line in every.stdout.splitlines()} == {"node0", "node1"}
    assert "node1: podguard train: PASS on 2 GPU(s) in 842 ms" in every.stdout.splitlines()
    one = pg(["pod", "logs", "ring", "--node", "1"])
    assert one.returncode == 0 and one.stdout and all(line.startswith("node1: ") for line in one.stdout.splitlines())
    bad = pg(["pod", "logs", "ring", "--node", "7"])
    assert bad.returncode == 64 and "ranks: 0, 1" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_restarted_nodes_long_backlog_is_skipped_without_recursion(standin):  # noqa: F811
    """NodeStreams over real SSE streams: 6000 lines of node 1's old stream are still queued when its stream is
    reopened (the node restarted); the next get() skips them all and returns the new stream's line."""
    from podguard.pods.api import open_api
    from podguard.pods.clusters.rest import ClusterApi
    from podguard.pods.clusters.streams import NodeStreams
    from podguard.pods.tuning import Tuning

    world = standin.world
    cluster = world.create_cluster(
        {"name": "ring", "type": "TRAINING", "image": "img:1", "compute": {
            "gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 2, "podCount": 2}}
    )  # fmt: skip
    node1 = next(p for p in world.members(cluster) if p.rank == 1)
    backlog = 6000
    for i in range(backlog):
        world.emit(node1.id, f"old line {i}")
    api = open_api("rest")
    (member,) = [m for m in ClusterApi(api).members(cluster.id) if m.rank == 1]
    with NodeStreams(api, Tuning.from_env()) as nodes:
        nodes.open(member, since="1970-01-01T00:00:00Z", tail=None, source="container")
        deadline = time.monotonic() + 60
        while nodes._queue.qsize() < backlog:  # the whole backlog has arrived and waits in the queue
            assert time.monotonic() < deadline, nodes._queue.qsize()
            time.sleep(0.05)
        fresh = world.emit(node1.id, "after the restart")
        nodes.open(member, since=fresh.ts, tail=None, source="container")  # the node restarted: a new stream
        item = nodes.get(timeout=20.0)
    assert item is not None
    rank, event = item
    assert rank == 1 and event.line == "after the restart"


def test_down_deletes_every_node_and_stop_start_restart_are_64(standin, tmp_path):  # noqa: F811
    assert up(cluster_spec(tmp_path, 2)).returncode == 0
    (cluster,) = standin.world.clusters.values()
    members = standin.world.members(cluster)
    for action in ("stop", "start", "restart"):
        refused = pg(["pod", action, "ring"])
        assert refused.returncode == 64, refused.stderr
        assert "pod heal ring" in refused.stderr and "pod down ring" in refused.stderr
    assert standin.calls("POST", r"/action$") == []
    down = pg(["pod", "down", "ring"])
    assert down.returncode == 0, down.stderr
    assert standin.world.clusters == {} and all(p.status == "TERMINATED" for p in members)
    assert pg(["pod", "status", "ring"]).returncode == 66
    assert pg(["pod", "down", "ring"]).returncode == 0  # already gone: success


def test_heal_restarts_the_sick_node_where_the_api_allows_member_actions(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.member_actions = True
    world.script = lambda pod: UNHEALTHY if pod.rank == 1 and pod.starts == 1 else PASS
    assert up(cluster_spec(tmp_path, 2)).returncode == 76
    (cluster,) = world.clusters.values()
    node1 = next(p for p in world.members(cluster) if p.rank == 1)
    proc = pg(["pod", "heal", "ring", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(c.body)["action"] for c in standin.calls("POST", rf"^/v2/pods/{node1.id}/action$")] == [
        "restart"
    ]
    assert standin.calls("POST", r"/action$") == standin.calls("POST", rf"^/v2/pods/{node1.id}/action$")
    steps = json.loads(proc.stdout)["heal"]["steps"]
    assert [(s["step"], s["result"]) for s in steps] == [("restart", "pass")]
    assert node1.starts == 2 and list(world.clusters) == [cluster.id] and len(creates(standin)) == 1
    again = pg(["pod", "heal", "ring", "--json"])  # a healthy cluster: judged, nothing done
    assert again.returncode == 0 and json.loads(again.stdout)["heal"]["steps"] == [], again.stderr
    assert len(standin.calls("POST", r"/action$")) == 1


def test_heal_where_members_refuse_actions_needs_replace_then_recreates_the_cluster(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.new_machine_health = ["ok", "broken"]  # node 1's machine never passes
    spec = cluster_spec(tmp_path, 2, extra='\n[network_volume]\nid = "vol-42"\npath = "/workspace"\n')
    assert up(spec).returncode == 76
    (old,) = world.clusters.values()
    refused = pg(["pod", "heal", "ring"])
    assert refused.returncode == 64, refused.stderr
    assert "--replace" in refused.stderr and "409" in refused.stderr
    assert list(world.clusters) == [old.id] and len(creates(standin)) == 1
    proc = pg(["pod", "heal", "ring", "--replace", "--json"])
    assert proc.returncode == 0, proc.stderr
    (new,) = world.clusters.values()
    assert new.id != old.id and new.name == "ring"
    first, second = creates(standin)
    assert second["mounts"] == first["mounts"] == {"network": [{"volumeId": "vol-42", "path": "/workspace"}]}
    assert second["dataCenterIds"] == [old.dc]  # the network volume pins the data centre
    for key in ("name", "type", "compute", "image", "args", "env", "ports", "disk"):
        assert second[key] == first[key], key
    assert all(world.pods[p].status == "TERMINATED" for p in old.members)
    out = json.loads(proc.stdout)
    assert out["id"] == new.id and [(s["step"], s["result"]) for s in out["heal"]["steps"]] == [
        ("restart", "refused"),
        ("replace", "pass"),
    ]


def heal_records(tmp_path: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((tmp_path / "state" / "heal").glob("*.json"))]


def test_an_error_after_the_delete_says_the_cluster_is_gone_and_what_to_run(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.new_machine_health = ["ok", "broken"]
    assert up(cluster_spec(tmp_path, 2)).returncode == 76
    (old,) = world.clusters.values()
    world.balance_ok = False  # the account runs dry: the delete goes through, the create is a 402
    proc = pg(["pod", "heal", "ring", "--replace"])
    assert proc.returncode == 77, proc.stderr
    assert "HTTP 402" in proc.stderr and "Traceback" not in proc.stderr
    assert f"cluster ring ({old.id}) was deleted and no new one was created" in proc.stderr
    assert "`podguard pod up --spec FILE` (the cluster's spec) recreates it" in proc.stderr
    assert world.clusters == {}
    (record,) = heal_records(tmp_path)
    assert record["code"] == 77 and "was deleted" in record["message"]
    assert [(s["step"], s["result"]) for s in record["steps"]] == [("restart", "refused"), ("replace", "error")]


def test_an_interrupted_wait_after_the_recreate_names_the_new_cluster(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.new_machine_health = ["ok", "broken"]
    assert up(cluster_spec(tmp_path, 2)).returncode == 76
    (old,) = world.clusters.values()
    world.script = lambda pod: []  # the new nodes never print a verdict: heal waits
    proc = subprocess.Popen(
        [*PODGUARD, "pod", "heal", "ring", "--replace"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120  # generous: a busy machine; the condition, not the clock, decides

    def following_the_new_nodes() -> bool:
        """The heal waits on the new cluster: both of its nodes' log streams were requested (the streams of the old
        nodes, reopened or not, do not count: they said nothing about where the heal is)."""
        with world.lock:
            new = [c for c in world.clusters.values() if c.id != old.id]
            members = set(new[0].members) if new else set()
        streams = {c.path.split("/")[3] for c in standin.calls("GET", r"/logs$")}
        return len(members) == 2 and members <= streams

    while not following_the_new_nodes():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    (new,) = world.clusters.values()
    assert proc.returncode == 130, err
    assert f"cluster ring ({old.id}) was deleted and {new.id} created in its place, but it was not judged" in err
    assert "`podguard pod wait ring` follows it" in err and "Traceback" not in err
    (record,) = heal_records(tmp_path)
    assert record["code"] == 130 and record["steps"][-1]["step"] == "replace"


@pytest.mark.parametrize("status", ["400", "403"])
def test_member_actions_refused_with_400_or_403_are_refusals_not_failures(standin, tmp_path, status):  # noqa: F811
    world = standin.world
    world.script = lambda pod: UNHEALTHY if pod.rank == 1 else PASS
    assert up(cluster_spec(tmp_path, 2)).returncode == 76
    (cluster,) = world.clusters.values()
    node1 = next(p for p in world.members(cluster) if p.rank == 1)
    standin.fault("POST", r"/action$", status, times=3)
    heal = pg(["pod", "heal", "ring"])
    assert heal.returncode == 64, heal.stderr
    assert f"RunPod refuses actions on the member nodes of cluster ring (HTTP {status})" in heal.stderr
    assert "rerun with --replace" in heal.stderr and "Traceback" not in heal.stderr
    (record,) = heal_records(tmp_path)
    assert [(s["step"], s["result"]) for s in record["steps"]] == [("restart", "refused")]
    stop = pg(["pod", "stop", node1.id])
    assert stop.returncode == 64, stop.stderr
    assert f"is node1 of cluster {cluster.id}: RunPod refused stop of a member node (HTTP {status})" in stop.stderr
    assert len(stop.stderr.strip().splitlines()) == 1 and node1.status == "RUNNING"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("[cluster]\nnodes = 1\n", "[cluster] nodes = 1 is not valid; expected a whole number 2-250"),
        ("[cluster]\nnodes = 251\n", "[cluster] nodes = 251 is not valid"),
        ('[cluster]\nnodes = "4"\n', "[cluster] nodes = '4' is not valid"),
        ("[cluster]\ntype = 'TRAINING'\n", "[cluster] nodes is required"),
        ("[cluster]\nnodes = 2\ntype = 'MPI'\n", "[cluster] type = 'MPI' is not valid; expected one of TRAINING"),
        ("[cluster]\nnodes = 2\nspread = true\n", "[cluster] spread is not a known key"),
        ("interruptible = true\n[cluster]\nnodes = 2\n", "interruptible is refused with [cluster]"),
        ("[cluster]\nnodes = 2\n[limits]\nrestarts = 2\n", "[limits] restarts is refused with [cluster]"),
        (
            'args = "train --restarts 2 -- python x.py"\n[cluster]\nnodes = 2\n',
            "args '--restarts 2' is refused with [cluster]",
        ),
        ('args = "train --restarts=1"\n[cluster]\nnodes = 2\n', "args '--restarts=1' is refused with [cluster]"),
        (
            '[cluster]\nnodes = 2\n[env]\nPODGUARD_RESTARTS = "2"\n',
            "[env] PODGUARD_RESTARTS is refused with [cluster]",
        ),
    ],
)
def test_bad_cluster_specs_are_64_with_one_line_and_no_request(standin, tmp_path, table, says):  # noqa: F811
    base = 'name = "ring"\nimage = "img:1"\n' + table + '[gpu]\ntypes = ["NVIDIA A40"]\n'
    proc = pg(["pod", "up", "--spec", str(write_spec(tmp_path / "bad.toml", base))])
    assert proc.returncode == 64 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and standin.requests == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('[cluster]\nnodes = 2\n[cpu]\nid = "cpu3c"\nvcpus = 4\n', "[cpu] is refused with [cluster]"),
        ("[cluster]\nnodes = 2\n", "[cluster] needs a [gpu] table"),
    ],
)
def test_a_cluster_needs_gpu_nodes(standin, tmp_path, body, says):  # noqa: F811
    proc = pg(["pod", "up", "--spec", str(write_spec(tmp_path / "bad.toml", 'name = "c"\nimage = "i"\n' + body))])
    assert proc.returncode == 64 and says in proc.stderr and standin.requests == [], proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_restarts_that_are_the_jobs_own_or_zero_are_not_podguards(tmp_path):
    from podguard.pods.spec import load_spec

    for args in ("train --restarts 0 -- python x.py", "train -- python x.py --restarts 3"):
        text = f'name = "ring"\nimage = "img:1"\nargs = "{args}"\n[cluster]\nnodes = 2\n[gpu]\ntypes = ["NVIDIA A40"]\n'
        assert load_spec(write_spec(tmp_path / "ok.toml", text)).cluster is not None


def test_clusters_are_rest_only(standin, tmp_path):  # noqa: F811
    proc = pg(["pod", "up", "--spec", str(cluster_spec(tmp_path, 2)), "--api", "graphql"])
    assert proc.returncode == 64 and "REST v2 only" in proc.stderr and standin.requests == [], proc.stderr


def test_get_pods_sends_only_documented_parameters_and_reads_one_answer(standin, tmp_path):  # noqa: F811
    # RunPod's spec (Frontdoor v2.9.0) answers every pod in one {"pods": [...]}; the stand-in refuses any query
    # parameter but includeClusterPods, as a client that invents `limit`/`cursor` paging would deserve
    world = standin.world
    world.set_capacity("NVIDIA A40", 100)
    trainer = world.create({"name": "trainer", "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 2}})
    for i in range(40):  # newer pods come first: "trainer" is the last of a long answer
        world.create({"name": f"busy-{i}", "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 1}})
    assert up(cluster_spec(tmp_path, 2)).returncode == 0  # members are hidden unless includeClusterPods=true
    spec = str(write_spec(tmp_path / "pod.toml", A40_SPEC))
    proc = pg(["pod", "up", "--spec", spec, "--json", "--adopt", trainer.id])  # made by hand: handed over
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["action"] == "reused" and standin.calls("POST", r"^/v2/pods$") == []
    listed = json.loads(pg(["pod", "list", "--json"]).stdout)
    assert len(listed) == 42 and next(i for i in listed if i["name"] == "ring")["nodes"] == 2
    node1 = next(p for p in world.pods.values() if p.rank == 1)
    assert pg(["pod", "status", node1.id]).returncode == 0  # a member id: found with includeClusterPods=true
    reads = standin.calls("GET", r"^/v2/pods$")
    assert {urlsplit(c.target).query for c in reads} == {"", "includeClusterPods=true"}


def test_the_standin_answers_get_pods_as_the_spec_does(standin):  # noqa: F811
    """The suite's stand-in itself: no pagination object, and an invented parameter is refused."""
    standin.world.create({"name": "a", "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 1}})
    headers = {"Authorization": f"Bearer {standin.key}"}
    with urlopen(Request(f"{standin.url}/v2/pods", headers=headers), timeout=10) as answer:
        assert set(json.load(answer)) == {"pods"}
    for query in ("limit=1000", "cursor=pod0001x", "includeClusterPods=maybe"):
        with pytest.raises(HTTPError) as refused:
            urlopen(Request(f"{standin.url}/v2/pods?{query}", headers=headers), timeout=10)
        assert refused.value.code == 422


def test_the_standin_returns_env_on_every_pod_object_as_the_openapi_requires(standin):  # noqa: F811
    """REST v2's Pod has `env` among its required fields (runpod/docs api-reference-v2/openapi.json): on a GET, in
    `GET /v2/pods`, and for cluster members (`GET /v2/clusters/{id}/pods`, `includeClusterPods=true`). podguard's
    mark is read from it."""
    world = standin.world
    env = {"PODGUARD_MARK": "podguard/1 name=x keep=up spec=- gpus=1", "A": "1"}
    pod = world.create({"name": "a", "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 1}, "env": env})
    cluster = world.create_cluster(
        {
            "name": "ring",
            "type": "TRAINING",
            "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2},
            "image": "img:1",
            "env": env,
        }
    )
    headers = {"Authorization": f"Bearer {standin.key}"}

    def get(path: str):
        with urlopen(Request(f"{standin.url}{path}", headers=headers), timeout=10) as answer:
            return json.load(answer)

    assert get(f"/v2/pods/{pod.id}")["env"] == env
    assert [p["env"] for p in get("/v2/pods")["pods"]] == [env]  # members hidden without includeClusterPods
    assert [p["env"] for p in get("/v2/pods?includeClusterPods=true")["pods"]] == [env, env, env]
    assert [p["env"] for p in get(f"/v2/clusters/{cluster.id}/pods")["pods"]] == [env, env]
    assert "env" not in get(f"/v2/clusters/{cluster.id}")  # the Cluster object has none: the mark is on its members


def test_a_create_body_over_100_kb_is_64_naming_the_env_size(standin, tmp_path):  # noqa: F811
    big = "x" * 120_000
    pod_spec = write_spec(tmp_path / "pod.toml", A40_SPEC.replace('WANDB_PROJECT = "demo"', f'BLOB = "{big}"'))
    big_cluster = tmp_path / "big-cluster.toml"
    big_cluster.write_text(cluster_spec(tmp_path, 2).read_text().replace('WANDB_PROJECT = "demo"', f'BLOB = "{big}"'))
    for spec in (pod_spec, big_cluster):
        proc = pg(["pod", "up", "--spec", str(spec)])
        assert proc.returncode == 64, proc.stderr
        assert re.search(r"HTTP 413.*env 117\.\d KB in 2 variables", proc.stderr), proc.stderr
        assert [line for line in proc.stderr.splitlines() if "error" in line] == proc.stderr.splitlines()[-1:]
        assert big not in proc.stderr
    assert standin.world.pods == {} and standin.world.clusters == {}


def test_a_spot_spec_says_once_that_spot_is_graphql_only(standin, tmp_path):  # noqa: F811
    spot = write_spec(tmp_path / "spot.toml", A40_SPEC.replace("[gpu]", "interruptible = true\n[gpu]"))
    proc = pg(["pod", "up", "--spec", str(spot)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("spot pods exist only through GraphQL") == 1


def test_the_shipped_cluster_spec_is_valid():
    spec = load_spec(ROOT / "runpod" / "cluster.toml")
    assert spec.cluster is not None and spec.cluster.nodes >= 2 and spec.gpu is not None


def test_no_wait_returns_once_the_cluster_exists(standin, tmp_path):  # noqa: F811
    proc = up(cluster_spec(tmp_path, 2), "--no-wait")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["action"] == "created" and out["ready"] is None and out["nodes"] == 2
    assert standin.calls("GET", r"/logs$") == []


def test_a_restart_that_does_not_help_is_76_with_the_replace_hint(standin, tmp_path):  # noqa: F811
    world = standin.world
    world.member_actions = True
    world.new_machine_health = ["broken", "ok"]  # node 0's machine never passes, restarted or not
    assert up(cluster_spec(tmp_path, 2)).returncode == 76
    proc = pg(["pod", "heal", "ring"])
    assert proc.returncode == 76, proc.stderr
    assert "node0 UNHEALTHY" in proc.stderr and "--replace" in proc.stderr
    assert len(standin.calls("POST", r"/action$")) == 1 and len(world.clusters) == 1


def test_a_member_pod_id_names_that_node_and_a_refused_action_names_its_cluster(standin, tmp_path):  # noqa: F811
    assert up(cluster_spec(tmp_path, 2)).returncode == 0
    (cluster,) = standin.world.clusters.values()
    node1 = next(p for p in standin.world.members(cluster) if p.rank == 1)
    status = pg(["pod", "status", node1.id, "--json"])
    assert status.returncode == 0 and json.loads(status.stdout)["id"] == node1.id, status.stderr
    logs = pg(["pod", "logs", node1.id, "--tail", "3"])
    assert logs.returncode == 0 and "podguard train: PASS" in logs.stdout
    for action in ("stop", "down"):
        refused = pg(["pod", action, node1.id])
        assert refused.returncode == 64, refused.stderr
        assert f"is node1 of cluster {cluster.id}" in refused.stderr and f"pod heal {cluster.id}" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert node1.status == "RUNNING" and len(standin.calls("POST", r"/action$")) == 1
    assert len(standin.calls("DELETE", r"^/v2/pods/")) == 1  # both were asked: the 409 is RunPod's answer
    standin.world.member_actions = True
    assert pg(["pod", "restart", node1.id]).returncode == 0 and node1.last_start == "restart"

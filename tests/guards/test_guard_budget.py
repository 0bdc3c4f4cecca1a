"""`--max-cost`'s arithmetic and what it reads: a pod's spend, an Instant Cluster's spend over all its members, the
warnings when the API leaves something out, and one read against the suite's stand-in RunPod API (real HTTP)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pods"))  # the stand-in API and its fixture

from pods_support import standin  # noqa: F401 (fixture)

from podguard import console
from podguard.pods.pod import Pod, PodStatus
from podguard.pods.thispod.meter import Budget, Meter, budget_from, read_budget

WALL = 1_800_000_000.0  # "now" on the wall clock for budget_from


def iso(seconds_before_wall: float) -> str:
    return datetime.fromtimestamp(WALL - seconds_before_wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod(pid: str, cost: float | None, ran_s: float | None, status: PodStatus = PodStatus.RUNNING) -> Pod:
    started = None if ran_s is None else iso(ran_s)
    return Pod(pid, pid, status, None, cost, None, (), (), started_at=started)


# -- the arithmetic --------------------------------------------------------------------------------------------------


def test_a_pods_spend_is_its_price_times_its_running_time():
    b = Budget("p1", (Meter("p1", 3.6, 1000.0),), read_at=50.0)
    assert b.cost_per_hr == 3.6 and b.what == "pod p1" and b.nodes == 1
    assert (b.elapsed(40.0), b.elapsed(50.0), b.elapsed(60.0)) == (0.0, 0.0, 10.0)  # never negative
    assert b.spent(50.0) == pytest.approx(1.0)  # $3.60/hr for 1000 s
    assert b.spent(40.0) == pytest.approx(1.0)  # a clock read before the read: no refund
    assert b.spent(950.0) == pytest.approx(1.9)  # 900 s more
    assert b.reached_at(1.9) == pytest.approx(950.0)
    assert b.reached_at(0.5) == pytest.approx(-450.0)  # already spent: the deadline is in the past
    assert (b.running_s(0.0), b.running_s(50.0), b.running_s(70.0)) == (1000.0, 1000.0, 1020.0)


def test_a_clusters_spend_is_the_sum_over_its_members():
    meters = (Meter("n0", 3.6, 3600.0), Meter("n1", 1.8, 1800.0), Meter("n2", 0.0, 500.0))  # n2 stopped: $0/hr
    b = Budget("n1", meters, read_at=100.0, cluster_id="c1", nodes=4)
    assert b.cost_per_hr == pytest.approx(5.4) and b.what == "cluster c1 (4 nodes)"
    assert b.spent(100.0) == pytest.approx(3.6 + 0.9)
    assert b.spent(460.0) == pytest.approx(4.5 + 5.4 * 0.1)  # every running member's meter moves on
    assert b.reached_at(5.04) == pytest.approx(460.0)
    assert b.reached_at(150.0) == pytest.approx(100.0 + (150.0 - 4.5) / 5.4 * 3600.0)
    assert b.running_s(160.0) == 3660.0  # the longest-running member


def test_150_usd_on_4_nodes_trips_at_150_in_all_not_600():
    b = Budget("n2", tuple(Meter(f"n{r}", 14.0, 0.0) for r in range(4)), read_at=0.0, cluster_id="c1", nodes=4)
    hours = b.reached_at(150.0) / 3600.0
    assert hours == pytest.approx(150.0 / 56.0)  # $56/hr in all: 2.7 h, not the 10.7 h one node alone would take
    assert b.spent(b.reached_at(150.0)) == pytest.approx(150.0)


# -- what the API gave --------------------------------------------------------------------------------------------


def test_a_pod_read_from_the_api():
    with console.captured() as said:
        b = budget_from("p1", None, [pod("p1", 3.52, 3600.0)], WALL, 7.0)
    assert b == Budget("p1", (Meter("p1", 3.52, pytest.approx(3600.0)),), 7.0, None, 1)
    assert said == []


@pytest.mark.parametrize("cost", [None, 0.0])
def test_a_pod_without_a_price_turns_the_guard_off_with_one_line(cost):
    with console.captured() as said:
        b = budget_from("p1", None, [pod("p1", cost, 60.0)], WALL, 0.0)
    assert b is None
    assert said == ["podguard: warning: --max-cost: the API gives no cost per hour for pod p1; the guard is off"]


@pytest.mark.parametrize("started", [None, -30.0], ids=["no-start", "clock-skew"])
def test_a_pod_without_a_start_counts_from_now(started):
    with console.captured() as said:
        b = budget_from("p1", None, [pod("p1", 1.0, started)], WALL, 0.0)
    assert b is not None and b.meters == (Meter("p1", 1.0, 0.0),) and b.spent(3600.0) == pytest.approx(1.0)
    expected = ["podguard: warning: --max-cost: the API gives no start time for pod p1; counting from now"]
    assert said == (expected if started is None else [])  # a start in the future is "just now", said nothing


def test_a_clusters_members_read_from_the_api():
    members = [
        pod("n0", 3.52, 3600.0),
        pod("n1", None, 3600.0),  # no price: not counted, said
        pod("n2", 3.52, None),  # no start: counts from now, said
        pod("n3", 0.0, 100.0, PodStatus.EXITED),
        pod("n4", None, None),
        pod("n5", 1.0, None),
    ]
    with console.captured() as said:
        b = budget_from("n2", "c1", members, WALL, 0.0)
    assert b is not None and b.what == "cluster c1 (6 nodes)" and b.pod_id == "n2" and b.cluster_id == "c1"
    assert [m.pod_id for m in b.meters] == ["n0", "n2", "n3", "n5"] and b.cost_per_hr == pytest.approx(8.04)
    assert b.spent(0.0) == pytest.approx(3.52) and b.running_s(0.0) == pytest.approx(3600.0)
    assert said == [
        "podguard: warning: --max-cost: the API gives no cost per hour for pod(s) n1, n4 of cluster c1; not counted",
        "podguard: warning: --max-cost: the API gives no start time for pod(s) n2, n5 of cluster c1; counting from now",
    ]


def test_a_cluster_without_any_price_turns_the_guard_off():
    members = [pod("n0", None, 10.0), pod("n1", 0.0, 10.0)]
    with console.captured() as said:
        b = budget_from("n0", "c1", members, WALL, 0.0)
    assert b is None
    assert said == ["podguard: warning: --max-cost: the API gives no cost per hour for cluster c1; the guard is off"]


# -- one read against the stand-in ---------------------------------------------------------------------------------


def running(world, record) -> None:
    deadline = time.monotonic() + 30
    while record.status != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_read_budget_of_a_pod_is_one_get(standin):  # noqa: F811
    record = standin.world.create({"name": "solo", "image": "i", "gpu": {"id": "NVIDIA A40", "count": 2}})
    running(standin.world, record)
    standin.world.backdate(record.id, 1800)
    with console.captured() as said:
        b = read_budget(record.id)
    assert b is not None and b.cluster_id is None and b.nodes == 1 and said == []
    assert b.cost_per_hr == pytest.approx(0.88) and b.spent(b.read_at) == pytest.approx(0.44, abs=0.01)
    assert [r.path for r in standin.requests] == [f"/v2/pods/{record.id}"]


def test_read_budget_of_a_cluster_member_counts_every_member(standin):  # noqa: F811
    world = standin.world
    world.set_capacity("NVIDIA A40", 64)
    compute = {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 8, "podCount": 4}
    cluster = world.create_cluster({"name": "ring", "type": "TRAINING", "image": "i", "compute": compute})
    for member in world.members(cluster):
        running(world, member)
        world.backdate(member.id, 3600)
    node2 = next(p for p in world.members(cluster) if p.rank == 2)
    with console.captured() as said:
        b = read_budget(node2.id)
    assert b is not None and said == [] and b.cluster_id == cluster.id and b.what == f"cluster {cluster.id} (4 nodes)"
    assert b.cost_per_hr == pytest.approx(14.08) and b.spent(b.read_at) == pytest.approx(14.08, abs=0.05)
    assert [r.path for r in standin.requests] == [f"/v2/pods/{node2.id}", f"/v2/clusters/{cluster.id}/pods"]

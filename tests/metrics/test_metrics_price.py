"""The price and spend series inside a pod, against the suite's stand-in RunPod API (RUNPOD_POD_ID, the REST API).

Why: the bill is what a person watching a run cares about most. The price is the pod's own cost per hour from the
API, read once whether or not a cost guard is set (with `--max-cost` the guard's read is reused: no second
request), and the spend is that price over the time since the pod started, so it keeps growing between scrapes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pods"))  # the stand-in API and its fixture

from metrics_support import free_port, job, moved, start, try_scrape, values, wait_for
from pods_support import standin  # noqa: F401 (fixture)

A40_X8_PER_HR = 0.44 * 8  # the stand-in's price of 8x A40


@pytest.fixture
def pod(standin, cli_node):  # noqa: F811
    """This container's pod in the stand-in, RUNNING for an hour: 8x A40 at $3.52/hr."""
    record = standin.world.create(
        {
            "name": "trainer",
            "image": "img:1",
            "args": "run",
            "ports": ["9464/http"],
            "gpu": {"id": "NVIDIA A40", "count": 8},
        }
    )
    wait_for(lambda: record.status == "RUNNING", "the pod to run")
    standin.world.backdate(record.id, 3600.0)
    return record


@pytest.mark.parametrize("guard", [[], ["--max-cost", "1000"]], ids=["no-cost-guard", "with-max-cost"])
def test_price_and_spend_inside_a_pod(standin, pod, cli_node, tmp_path, guard):  # noqa: F811
    script, stop = job(tmp_path)
    port = free_port()
    args = ["run", *guard, "--metrics-port", str(port), "--", sys.executable, script, str(stop)]
    proc = start(cli_node, args, RUNPOD_POD_ID=pod.id)
    try:
        first = wait_for(
            lambda: (f := try_scrape(port)) and "podguard_spend_dollars" in f and f, "the price", proc=proc
        )
        second = moved(port, "podguard_spend_dollars", first, proc)
    finally:
        stop.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err

    assert values(first["podguard_price_dollars_per_hour"]) == {(): pytest.approx(A40_X8_PER_HR)}
    spent = values(first["podguard_spend_dollars"])[()]
    assert A40_X8_PER_HR <= spent < A40_X8_PER_HR * (1 + 60 / 3600)  # an hour and (at most) a minute
    assert values(second["podguard_spend_dollars"])[()] > spent
    [(info, _)] = values(first["podguard_info"]).items()
    assert dict(info)["pod_id"] == pod.id
    assert len(standin.calls("GET", rf"^/v2/pods/{pod.id}$")) == 1  # one read, the guard's where there is one


def test_outside_a_pod_there_is_no_price_and_no_request(standin, cli_node, tmp_path):  # noqa: F811
    script, stop = job(tmp_path)
    port = free_port()
    proc = start(cli_node, ["run", "--metrics-port", str(port), "--", sys.executable, script, str(stop)])
    try:
        families = wait_for(
            lambda: (f := try_scrape(port)) and "podguard_rank_heartbeats" in f and f, "beats", proc=proc
        )
    finally:
        stop.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "podguard_price_dollars_per_hour" not in families and "podguard_spend_dollars" not in families
    assert standin.calls("GET", r"^/v2/pods/") == []

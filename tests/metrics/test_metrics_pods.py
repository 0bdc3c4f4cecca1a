"""`pod up` and `pod status` print the pod's metrics URL through RunPod's HTTP proxy when the spec exposes the port
(`[env] PODGUARD_METRICS_PORT` and `ports = ["9464/http"]`), as subprocesses against the stand-in API.

Why: a person who starts a pod from a laptop needs the address to put in Prometheus or a browser; RunPod forms it
as https://{POD_ID}-{INTERNAL_PORT}.proxy.runpod.net (runpod/docs, pods/configuration/expose-ports.mdx). A port
that is not exposed over HTTP has no proxy address: nothing is printed rather than a URL that cannot answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pods"))  # the stand-in API and its fixture

from pods_support import A40_SPEC, pg, standin, write_spec  # noqa: F401 (fixture)

from podguard.pods.proxy import metrics_port_of

EXPOSED = A40_SPEC.replace('ports = ["22/tcp", "8888/http"]', 'ports = ["22/tcp", "9464/http"]').replace(
    'WANDB_PROJECT = "demo"', 'WANDB_PROJECT = "demo"\n    PODGUARD_METRICS_PORT = "9464"'
)


def test_pod_up_and_status_print_the_metrics_proxy_url(standin, tmp_path):  # noqa: F811
    assert 'PODGUARD_METRICS_PORT = "9464"' in EXPOSED and '"9464/http"' in EXPOSED
    spec = write_spec(tmp_path / "pod.toml", EXPOSED)
    up = pg(["pod", "up", "--spec", str(spec)])
    assert up.returncode == 0, up.stderr
    (pod,) = standin.world.pods.values()
    url = f"https://{pod.id}-9464.proxy.runpod.net/metrics"
    assert f"metrics:  {url}" in up.stdout.splitlines()
    status = pg(["pod", "status", pod.id])
    assert status.returncode == 0, status.stderr
    assert f"metrics:  {url}" in status.stdout.splitlines()


def test_no_url_when_the_port_is_not_exposed_over_http(standin, tmp_path):  # noqa: F811
    tcp_only = EXPOSED.replace('"9464/http"', '"9464/tcp"')
    up = pg(["pod", "up", "--spec", str(write_spec(tmp_path / "pod.toml", tcp_only))])
    assert up.returncode == 0, up.stderr
    assert "proxy.runpod.net" not in up.stdout and "metrics:" not in up.stdout


@pytest.mark.parametrize(
    ("env", "args", "port"),
    [
        ({"PODGUARD_METRICS_PORT": "9464"}, "train -- python train.py", 9464),
        ({}, "train --metrics-port 9500 -- python train.py", 9500),
        ({"PODGUARD_METRICS_PORT": "9464"}, "train --metrics-port=9500", 9500),  # the option wins, as in the CLI
        ({}, "train -- python train.py --metrics-port 9500", None),  # the job's own argument, not podguard's
        ({"PODGUARD_METRICS_PORT": "0"}, "", None),
        ({"PODGUARD_METRICS_PORT": "{{ RUNPOD_SECRET_port }}"}, "", None),
    ],
)
def test_the_metrics_port_is_podguards_own_option_or_variable(env, args, port):
    assert metrics_port_of(env, args) == port

"""A real Prometheus scrapes a real run: `podguard train --metrics-port --metrics-file` on the fake 8-GPU node,
inside a pod of the suite's stand-in RunPod API (its price and spend), the file read by a real node_exporter's
textfile collector, beside an exporter that answers in NVIDIA dcgm-exporter's format. Then every query of the
dashboard, the docs' alert rules and the docs' DCGM recipes are evaluated by that Prometheus.

Why: PromQL that parses can still draw nothing, draw everything twice, or never fire. Prometheus 2.42 and
node_exporter 1.5 (Debian bookworm's) are what the issue's reports were made with; each scrapes every second, so
the module's one run takes seconds. Skipped (with the reason) where `prometheus` is not installed, and the
two-source checks where node_exporter is not.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from metrics_support import JOB, free_port
from prom_support import NODE_EXPORTER, PROMETHEUS, Prometheus, alert_rules, dashboard, docs_section, fill, queries

from fakenvml import NvmlNode, XidSpec, healthy_h100

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pods"))  # the stand-in RunPod API

from pods_support import KEY, api_env
from standin_api import StandIn

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)"
)

GPUS = {"1", "2"}  # the run's (of the node's 8)
GRAFANA = {"__rate_interval": "4s", "__interval": "1s", "__range": "1h", "max_cost": "1000"}  # (4 x 1 s scrapes)
MAY_BE_EMPTY = {  # a query whose answer depends on what happened: a straggler, an Xid, a relaunch
    "panel 'Step rate per rank (stragglers marked)' B",
    "panel 'Xid errors' A",
    "annotation 'Restarts'",
    "annotation 'Fatal GPU faults'",
}
PER_GPU = ("GPU health", "GPU utilisation", "GPU memory used", "GPU power", "GPU temperature")
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
}


def dcgm_id(index: int) -> int:
    """The exporter's GPU id on the host: not the NVML index inside podguard's container (a pod's GPUs are 0, 1 ...
    there), so a join on `gpu` pairs the wrong GPUs."""
    return (index + 3) % 8


def dcgm_text(node: NvmlNode) -> bytes:
    """What dcgm-exporter answers (its gpuMetricsFormat, release 4.5.3-4.8.2): gpu, UUID, pci_bus_id, device,
    modelName, Hostname."""
    lines = []
    for name, (kind, help_text) in DCGM_FIELDS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for g in node.scenario.gpus:
            gid = dcgm_id(g.index)
            labels = (
                f'gpu="{gid}",UUID="{g.uuid}",pci_bus_id="00000000:{0x18 + gid:02X}:00.0",device="nvidia{gid}",'
                f'modelName="{g.name}",Hostname="host-1"'
            )
            lines.append(f"{name}{{{labels}}} {40 + g.index}")
    return ("\n".join(lines) + "\n").encode()


def serve(text: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class World:
    node: NvmlNode
    prom: Prometheus
    proc: Any
    stop: Path
    textfile: Path
    sources: tuple[str, ...]  # the scrape jobs that carry podguard's series
    log: Path
    closers: list[Any] = field(default_factory=list)

    def uuid(self, gpu: str) -> str:
        return self.node.scenario.gpus[int(gpu)].uuid


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, fake_nvml: Any) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("prometheus")
    node = NvmlNode(root=tmp / "node", lib_dir=fake_nvml.lib_dir, scenario=healthy_h100())
    node.write()
    closers: list[Any] = [node.teardown]
    try:
        api = StandIn(KEY).start()
        closers.append(api.close)
        api.world.set_capacity("NVIDIA A40", 8)
        pod = api.world.create(
            {"name": "trainer", "image": "img", "args": "train", "gpu": {"id": "NVIDIA A40", "count": 8}}
        )
        deadline = time.monotonic() + 30
        while pod.status != "RUNNING":
            assert time.monotonic() < deadline, "the stand-in pod never ran"
            time.sleep(0.05)
        api.world.backdate(pod.id, 3600.0)

        folder = tmp / "textfile"
        folder.mkdir()
        port = free_port()
        scrape = [{"job_name": "podguard", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
        sources: tuple[str, ...] = ("podguard",)
        if NODE_EXPORTER is not None:
            ne_port = free_port()
            ne_args = [
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={folder}",
                f"--web.listen-address=127.0.0.1:{ne_port}",
            ]
            ne = _popen([NODE_EXPORTER, *ne_args], tmp / "node_exporter.log")
            closers.append(lambda: _end(ne))
            scrape.append({"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{ne_port}"]}]})
            sources += ("node",)
        dcgm = serve(dcgm_text(node))
        closers.append(dcgm.shutdown)
        scrape.append({"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{dcgm.server_port}"]}]})
        rules = tmp / "podguard-alerts.yml"
        rules.write_text(alert_rules())
        prom = Prometheus.start(tmp, scrape, [rules])
        closers.append(prom.close)

        script, stop = tmp / "beats.py", tmp / "stop"
        script.write_text(textwrap.dedent(JOB))
        env = {**node.env, **api_env(api, tmp / "home", tmp / "state"), "PODGUARD_PROBE": "off"}
        for var in ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT"):
            env.pop(var, None)
        env.update(RUNPOD_POD_ID=pod.id, PODGUARD_METRICS_INTERVAL="0.5")
        (tmp / "home").mkdir()
        args = ["train", "--mode", "per-gpu", "--gpu-list", "1,2", "--max-cost", "1000", "--metrics-port", str(port)]
        args += ["--metrics-file", str(folder / "podguard.prom"), "--", sys.executable, str(script), str(stop)]
        log = tmp / "podguard.log"
        proc = _popen([sys.executable, "-m", "podguard", *args], log, env)
        closers.append(lambda: (stop.touch(), _end(proc)))
        world = World(node, prom, proc, stop, folder / "podguard.prom", sources, log, closers)
        for job in sources:  # a few scrapes of each source with everything in them (the price comes on a thread)
            ready = (
                f'min(count_over_time(podguard_rank_heartbeats_total{{job="{job}"}}[1m])) >= 3'
                f' and on() count(podguard_gpu_xid_events_total{{job="{job}"}}) == 2'
                f' and on() count(podguard_spend_dollars{{job="{job}"}}) == 1'
            )
            prom.wait(lambda q=ready: _alive(world) and prom.query(q), f"{job}: the run's series in Prometheus", 90)
        yield world
    finally:
        for close in reversed(closers):
            close()


def _popen(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Any:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def _end(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
            proc.wait(timeout=10)


def _alive(world: World) -> bool:
    assert world.proc.poll() is None, f"podguard ended early: {world.log.read_text()[-3000:]}"
    return True


def _labels(result: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [r["metric"] for r in result]


def test_prometheus_scrapes_every_target_and_each_source_has_every_gpu_once(world):
    targets = world.prom.api("targets")["activeTargets"]
    assert {t["labels"]["job"]: t["health"] for t in targets} == {**dict.fromkeys(world.sources, "up"), "dcgm": "up"}
    for job in world.sources:
        events = world.prom.query(f'podguard_gpu_xid_events_total{{job="{job}"}}')
        assert {m["gpu"] for m in _labels(events)} == GPUS and {r["value"][1] for r in events} == {"0"}


def test_every_dashboard_query_evaluates_on_one_source_without_drawing_twice(world):
    dash = dashboard()
    for job in world.sources:
        values = {**GRAFANA, "job": job, "instance": ".*"}
        for where, expr in queries(dash):
            expr = fill(expr, values)
            if where.startswith("variable "):  # label_values(SELECTOR, LABEL), as Grafana asks for it
                selector, label = expr.removeprefix("label_values(").removesuffix(")").rsplit(",", 1)
                got = world.prom.api(f"label/{label.strip()}/values", **{"match[]": selector})
                assert got, f"{where}: {expr}"
                continue
            result = world.prom.query(expr)
            if where not in MAY_BE_EMPTY:
                assert result, f"{job}: {where}: no data: {expr}"
            for metric in _labels(result):
                assert metric.get("job", job) == job, f"{where}: another source's series: {metric}"
            title = where.split("'")[1] if "'" in where else ""
            if title in PER_GPU:  # each GPU once, not once per source
                assert sorted(m["gpu"] for m in _labels(result)) == sorted(GPUS), f"{where}: {result}"
    if len(world.sources) == 2:  # (what the dashboard did before it picked one: every GPU twice)
        assert len(world.prom.query('podguard_gpu_utilization_ratio{instance=~".*"}')) == 2 * len(GPUS)
    assert world.prom.value(fill(_expr("Stragglers now"), {**GRAFANA, "job": "podguard", "instance": ".*"})) in (0, 1)


def test_the_first_xid_fires_the_docs_alert_in_prometheus(world):
    assert not _alerts(world, "PodguardGpuXid")
    world.node.scenario.xids.append(XidSpec(gpu=1, xid=13))  # application-level: the job goes on
    world.node.write()
    firing = world.prom.wait(
        lambda: _alive(world) and len(f := _alerts(world, "PodguardGpuXid", "firing")) == len(world.sources) and f,
        "the Xid alert to fire for each source",
        60,
    )
    assert {(a["labels"]["job"], a["labels"]["gpu"], a["labels"]["uuid"]) for a in firing} == {
        (job, "1", world.uuid("1")) for job in world.sources
    }
    summary = f"Xid on GPU 1 ({world.uuid('1')}) of "
    assert all(a["annotations"]["summary"].startswith(summary) for a in firing)
    # (the obvious rule on the per-Xid counter sees nothing: its series was born at 1)
    assert world.prom.query('increase(podguard_gpu_xid_errors_total{job="podguard"}[1m]) > 0') == []
    others = {a["labels"]["alertname"] for a in world.prom.api("alerts")["alerts"]} - {"PodguardGpuXid"}
    assert not others, others


def test_the_docs_dcgm_recipes_pair_the_gpus_by_uuid(world):
    filtered, named = _promql_blocks(docs_section("Joining with NVIDIA's DCGM exporter"))
    result = world.prom.query(filtered)
    assert sorted((m["UUID"], m["job"]) for m in _labels(result)) == sorted((world.uuid(g), "dcgm") for g in GPUS)
    assert {m["__name__"] for m in _labels(result)} == {"DCGM_FI_DEV_GPU_UTIL"}
    rows = _labels(world.prom.query(named))
    assert len(rows) == len(GPUS)
    for m in rows:
        gid = dcgm_id(int(m["gpu"]))
        assert m["UUID"] == m["uuid"] == world.uuid(m["gpu"]) and m["job"] == "podguard"
        assert (m["device"], m["modelName"]) == (f"nvidia{gid}", "NVIDIA H100 80GB HBM3"), m
    # the labels as they are, without the recipe, find nothing
    assert world.prom.query('DCGM_FI_DEV_GPU_UTIL and on(uuid) podguard_gpu_healthy{job="podguard"}') == []


def test_after_the_run_the_files_copy_says_ended_and_its_progress_clock_stops(world):
    world.stop.touch()
    assert world.proc.wait(timeout=60) == 0, world.log.read_text()[-3000:]
    if "node" not in world.sources:
        pytest.skip("node_exporter not installed (Debian: apt-get install prometheus-node-exporter)")
    prom, values = world.prom, {**GRAFANA, "job": "node", "instance": ".*"}
    prom.wait(lambda: prom.value('podguard_up{job="node"}') == 0.0, "the file's last write in Prometheus", 30)
    stale = 'time() - podguard_job_last_progress_timestamp_seconds{job="node"}'
    first = prom.value(stale)
    prom.wait(lambda: (prom.value(stale) or 0) > first + 1.5, "the raw clock to move on", 30)
    assert prom.query(fill(_expr("Since last progress"), values)) == [], "the dashboard's clock must stop"
    assert prom.query(fill(_expr("Stragglers now"), values)) == []
    assert prom.value(fill(_expr("Run"), values)) == 0.0  # "ended"
    prom.wait(lambda: prom.value('up{job="podguard"}') == 0.0, "the endpoint's port to be closed", 30)
    assert prom.query('podguard_up{job="podguard"}') == [], "the endpoint's series go stale at once"
    assert not _alerts(world, "PodguardNoProgress") and not _alerts(world, "PodguardMetricsFileStale")


def _expr(title: str) -> str:
    [panel] = [p for p in dashboard()["panels"] if p["title"] == title]
    return panel["targets"][0]["expr"]


def _alerts(world: World, name: str, state: str | None = None) -> list[dict[str, Any]]:
    alerts = world.prom.api("alerts")["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and state in (None, a["state"])]


def _promql_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```promql\n(.*?)```", text, re.S)]

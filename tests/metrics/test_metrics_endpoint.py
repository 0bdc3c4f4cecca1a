"""`--metrics-port` end to end: a real `podguard run` of a heartbeat job on the fake 8-GPU node, scraped over HTTP
and read with prometheus_client's own parser (docs/metrics.md, "The series").

Why: the endpoint is what Prometheus and Grafana see. These tests pin every series (names, labels, HELP and TYPE),
that the GPU gauges are what NVML reports, that counters only grow and steps advance, that an Xid shows in the
counter and the health gauge while the job is still ending, and that the port is free again when the run ends.
"""

from __future__ import annotations

import sys

from metrics_support import by, free_port, job, moved, port_open, scrape, start, try_scrape, values, wait_for

from fakenvml import XidSpec
from fakenvml.scenario import MIB
from podguard.metrics.series import SERIES

GPUS = 8
NOT_IN_A_PLAIN_RUN = {"podguard_gpu_xid_errors", "podguard_price_dollars_per_hour", "podguard_spend_dollars"}
NOT_IN_A_PLAIN_RUN |= {s.name for s in SERIES if s.name.startswith("podguard_store_")}  # --checkpoint-store only


def distinct_gpus(node) -> None:
    """Each GPU reads differently, so a gauge on the wrong GPU shows."""
    for g in node.scenario.gpus:
        g.util_gpu = 10 * g.index + 5
        g.mem_used_mib = 1000 + g.index
        g.power_mw = 100_000 + 1_000 * g.index + 500
        g.temperature_c = 40 + g.index
    node.write()


def everything_in(families) -> bool:
    return (
        families is not None
        and {s.name for s in SERIES} - NOT_IN_A_PLAIN_RUN <= set(families)
        and all(
            len(families[n].samples) == GPUS
            for n in ("podguard_gpu_utilization_ratio", "podguard_rank_step", "podguard_rank_heartbeats")
        )
    )


def test_a_scrape_of_a_heartbeat_job_has_every_series_nvmls_values_and_growing_counters(cli_node, tmp_path):
    distinct_gpus(cli_node)
    script, stop = job(tmp_path)
    port = free_port()
    args = ["train", "--mode", "per-gpu", "--idle-memory-mib", "2048", "--metrics-port", str(port)]  # (memory in use)
    proc = start(cli_node, [*args, "--", sys.executable, script, str(stop)])
    try:
        first = wait_for(lambda: everything_in(try_scrape(port)) and scrape(port), "every series", proc=proc)
        second = moved(port, "podguard_rank_step", first, proc)
    finally:
        stop.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"metrics: http://0.0.0.0:{port}/metrics" in err

    for series in SERIES:  # HELP and TYPE of each, as Prometheus reads them; the labels the contract names
        if series.name in NOT_IN_A_PLAIN_RUN:
            continue
        family = first[series.name]
        assert family.type == series.kind and family.documentation == series.help, series.name
        for sample in family.samples:
            assert set(sample.labels) == set(series.labels), sample
            suffix = "_total" if series.kind == "counter" else ""
            assert sample.name == series.name + suffix
    assert values(first["podguard_up"]) == {(): 1.0}
    [(info, one)] = values(first["podguard_info"]).items()
    assert dict(info) == {"version": _version(), "mode": "per-gpu", "pod_id": ""} and one == 1.0
    assert values(first["podguard_job_attempt"]) == {(): 1.0}
    assert values(first["podguard_job_restarts"]) == {(): 0.0}

    uuids = {str(g.index): g.uuid for g in cli_node.scenario.gpus}
    healthy = {
        (s.labels["gpu"], s.labels["uuid"], s.labels["model"]): s.value for s in first["podguard_gpu_healthy"].samples
    }
    assert healthy == {(i, u, "NVIDIA H100 80GB HBM3"): 1.0 for i, u in uuids.items()}
    for name, expected in {
        "podguard_gpu_utilization_ratio": lambda i: (10 * i + 5) / 100,
        "podguard_gpu_memory_used_bytes": lambda i: (1000 + i) * MIB,
        "podguard_gpu_power_watts": lambda i: 100.5 + i,
        "podguard_gpu_temperature_celsius": lambda i: 40 + i,
    }.items():
        got = {(s.labels["gpu"], s.labels["uuid"]): s.value for s in first[name].samples}
        assert got == {(str(i), uuids[str(i)]): expected(i) for i in range(GPUS)}, name

    ranks = [str(r) for r in range(GPUS)]
    assert sorted(by(first["podguard_rank_heartbeats"], "rank")) == ranks
    assert set(by(first["podguard_rank_slow"], "rank").values()) == {0.0}
    for rank in ranks:  # counters only grow; every rank's step moved on between the two scrapes (or held)
        assert (
            by(second["podguard_rank_heartbeats"], "rank")[rank] >= by(first["podguard_rank_heartbeats"], "rank")[rank]
        )
        assert by(second["podguard_rank_step"], "rank")[rank] >= by(first["podguard_rank_step"], "rank")[rank]
    assert sum(by(second["podguard_rank_step"], "rank").values()) > sum(
        by(first["podguard_rank_step"], "rank").values()
    )
    stamps = by(second["podguard_rank_last_progress_timestamp_seconds"], "rank")
    [job_stamp] = values(second["podguard_job_last_progress_timestamp_seconds"]).values()
    assert abs(max(stamps.values()) - job_stamp) < 2.0 and abs(job_stamp - _now()) < 30  # Unix seconds

    assert not port_open(port), "the port must be closed when the run ends"


def test_an_xid_mid_run_shows_in_the_counter_and_the_health_gauge_before_the_job_ends(cli_node, tmp_path):
    script, stop = job(tmp_path)
    port = free_port()
    args = ["train", "--mode", "per-gpu", "--gpu-list", "1,2", "--grace", "60", "--metrics-port", str(port)]
    proc = start(cli_node, [*args, "--", sys.executable, script, str(stop), "hold"])
    try:
        wait_for(lambda: (f := try_scrape(port)) and "podguard_rank_heartbeats" in f, "the first heartbeats", proc=proc)
        first = scrape(port)
        assert "podguard_gpu_xid_errors" not in first  # (only once an Xid came) ...
        sc = cli_node.scenario
        events = {("1", sc.gpus[1].uuid): 0.0, ("2", sc.gpus[2].uuid): 0.0}  # ... the per-GPU total from the start
        assert {(s.labels["gpu"], s.labels["uuid"]): s.value for s in first["podguard_gpu_xid_events"].samples} == (
            events
        )
        sc.xids.append(XidSpec(gpu=1, xid=13))  # application-level: counted, the GPU stays healthy
        cli_node.write()
        wait_for(lambda: "podguard_gpu_xid_errors" in scrape(port), "the application Xid", proc=proc)
        sc.xids.append(XidSpec(gpu=2, xid=79))  # fatal: the job is ended (76); its workers take their time
        cli_node.write()
        fam = wait_for(
            lambda: (f := scrape(port)) and len(f["podguard_gpu_xid_errors"].samples) == 2 and f,
            "the fatal Xid",
            proc=proc,
        )
        assert proc.poll() is None, "the job must still be ending"
        xids = {
            (s.labels["gpu"], s.labels["uuid"], s.labels["xid"]): s.value
            for s in fam["podguard_gpu_xid_errors"].samples
        }
        assert xids == {("1", sc.gpus[1].uuid, "13"): 1.0, ("2", sc.gpus[2].uuid, "79"): 1.0}
        total = {(s.labels["gpu"], s.labels["uuid"]): s.value for s in fam["podguard_gpu_xid_events"].samples}
        assert total == {("1", sc.gpus[1].uuid): 1.0, ("2", sc.gpus[2].uuid): 1.0}
        assert by(fam["podguard_gpu_healthy"], "gpu") == {"1": 1.0, "2": 0.0}
    finally:
        stop.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 76, err
    assert not port_open(port)


def _version() -> str:
    from podguard import __version__

    return __version__


def _now() -> float:
    import time

    return time.time()

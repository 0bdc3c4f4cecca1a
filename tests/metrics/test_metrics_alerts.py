"""docs/metrics.md's alert rules, as Prometheus's own promtool reads them: the rule file is valid, and each alert
fires where it should and nowhere else, over series shaped as podguard exports them (promtool's rule unit tests).

Why: an alert rule that parses can still never fire. The obvious rule on the per-Xid counter never fires on the
first Xid (the series is born at 1, which `increase()` reads as no increase); a no-progress rule over a textfile
left after the run fires for ever. tests/metrics/test_metrics_prometheus.py evaluates the same file in a real
Prometheus scraping a real run; here the edge cases that a real run cannot stage quickly.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from prom_support import PROMTOOL, alert_rules

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")

POD = {"instance": "pod:9464", "job": "podguard"}
NODE = {"instance": "node:9100", "job": "node"}
GPU1 = {**POD, "gpu": "1", "uuid": "GPU-b"}
FILE = "/var/lib/node_exporter/textfile/podguard.prom"


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{text}}}", "values": values}


def expect(alertname: str, eval_time: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": eval_time, "alertname": alertname, "exp_alerts": alerts}


def xid_alert(labels: dict[str, str]) -> dict[str, Any]:
    summary = f"Xid on GPU {labels['gpu']} ({labels['uuid']}) of {labels['instance']}"
    return {"exp_labels": {**labels, "severity": "warning"}, "exp_annotations": {"summary": summary}}


# (why, input series every 15 s, [alert checks])
CASES: list[tuple[str, list[dict[str, str]], list[dict[str, Any]]]] = [
    (
        "the first Xid on a GPU whose total was 0 from the launch: fires at once",
        [series("podguard_gpu_xid_events_total", GPU1, "0x10 1x20")],  # the Xid comes at 2m45s
        [expect("PodguardGpuXid", "2m30s", []), expect("PodguardGpuXid", "3m", [xid_alert(GPU1)])],
    ),
    (
        "an Xid before Prometheus's first scrape of the GPU (the series is born at 1): fires too",
        [series("podguard_gpu_xid_events_total", GPU1, "_x4 1x20")],
        [expect("PodguardGpuXid", "1m30s", [xid_alert(GPU1)])],
    ),
    (
        "no Xid: never",
        [series("podguard_gpu_xid_events_total", GPU1, "0x80")],
        [expect("PodguardGpuXid", "5m", []), expect("PodguardGpuXid", "19m", [])],
    ),
    (
        "an Xid 20 minutes ago, none since: resolved",
        [series("podguard_gpu_xid_events_total", GPU1, "0x4 1x100")],
        [expect("PodguardGpuXid", "3m", [xid_alert(GPU1)]), expect("PodguardGpuXid", "20m", [])],
    ),
    (
        "a new podguard process (the container restarted) starts its total at 0: a reset, not an Xid",
        [series("podguard_gpu_xid_events_total", GPU1, "3x60 0x30")],
        [expect("PodguardGpuXid", "20m", [])],
    ),
    (
        "a fatal fault: the GPU is unhealthy",
        [series("podguard_gpu_healthy", {**GPU1, "model": "H100"}, "1x4 0x10")],
        [
            expect("PodguardGpuUnhealthy", "30s", []),
            expect(
                "PodguardGpuUnhealthy",
                "2m",
                [
                    {
                        "exp_labels": {**GPU1, "model": "H100", "severity": "critical"},
                        "exp_annotations": {"summary": "GPU 1 (GPU-b) of pod:9464 had a fatal fault"},
                    }
                ],
            ),
        ],
    ),
    (
        "no progress for 20 minutes while podguard runs: fires",
        [series("podguard_job_last_progress_timestamp_seconds", POD, "0x100"), series("podguard_up", POD, "1x100")],
        [
            expect("PodguardNoProgress", "10m", []),
            expect(
                "PodguardNoProgress",
                "20m",
                [
                    {
                        "exp_labels": {**POD, "severity": "warning"},
                        "exp_annotations": {"summary": "pod:9464: no progress for 20m 0s"},
                    }
                ],
            ),
        ],
    ),
    (
        "the textfile left after the run (podguard_up 0, its last progress time kept for ever): never",
        [series("podguard_job_last_progress_timestamp_seconds", NODE, "0x100"), series("podguard_up", NODE, "0x100")],
        [expect("PodguardNoProgress", "20m", [])],
    ),
    (
        "a textfile whose podguard was killed (podguard_up 1, not written for minutes): stale",
        [series("node_textfile_mtime_seconds", {**NODE, "file": FILE}, "0x20"), series("podguard_up", NODE, "1x20")],
        [
            expect("PodguardMetricsFileStale", "30s", []),
            expect(
                "PodguardMetricsFileStale",
                "2m",
                [
                    {
                        "exp_labels": {**NODE, "file": FILE, "severity": "warning"},
                        "exp_annotations": {"summary": f"{FILE} on node:9100 has not been written for 2m 0s"},
                    }
                ],
            ),
        ],
    ),
    (
        "a textfile after a run that ended (its last write says podguard_up 0): not stale, just over",
        [series("node_textfile_mtime_seconds", {**NODE, "file": FILE}, "0x20"), series("podguard_up", NODE, "0x20")],
        [expect("PodguardMetricsFileStale", "2m", [])],
    ),
]


def test_the_docs_alert_rules_are_valid_for_prometheus(tmp_path):
    path = tmp_path / "podguard-alerts.yml"
    path.write_text(alert_rules())
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "4 rules found" in check.stdout


def test_each_alert_fires_where_it_should_and_nowhere_else(tmp_path):
    (tmp_path / "podguard-alerts.yml").write_text(alert_rules())
    tests = [
        {"name": why, "interval": "15s", "input_series": inputs, "alert_rule_test": checks}
        for why, inputs, checks in CASES
    ]
    unit = {"rule_files": ["podguard-alerts.yml"], "evaluation_interval": "15s", "tests": tests}
    path = tmp_path / "podguard-alerts.test.yml"  # (promtool reads YAML, of which JSON is a part)
    path.write_text(json.dumps(unit))
    run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr

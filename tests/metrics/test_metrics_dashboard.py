"""The Grafana dashboard (docs/grafana/podguard-dashboard.json) as Grafana's import and Prometheus read it, and
docs/metrics.md's table of series and scrape config against the code and promtool.

Why: a dashboard that imports but queries a series podguard does not export, or applies rate() to a gauge (a step
that drops on a restart from a checkpoint reads as a counter reset: a spike), shows wrong graphs without an error.
Grafana's import replaces each `__inputs` entry's `${NAME}` everywhere in the JSON and refuses an import without a
value for each (grafana/grafana pkg/services/dashboardimport/utils/dash_template_evaluator.go): an input nothing
uses is a question whose answer is thrown away. Every query is checked by promtool's PromQL parser where it is
installed.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from prom_support import DASHBOARD, PROMTOOL, dashboard, queries

from podguard.metrics.series import SERIES

EXPORTED = {s.name + ("_total" if s.kind == "counter" else "") for s in SERIES}
COUNTERS = {s.name + "_total" for s in SERIES if s.kind == "counter"}
GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def datasources(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            yield node["datasource"]
        for value in node.values():
            yield from datasources(value)
    elif isinstance(node, list):
        for value in node:
            yield from datasources(value)


def test_the_import_asks_for_the_prometheus_data_source_and_uses_the_answer():
    dash = dashboard()
    text = DASHBOARD.read_text()
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash.get("id") is None
    inputs = {i["name"] for i in dash["__inputs"]}
    assert inputs == {"DS_PROMETHEUS"} and dash["__inputs"][0]["pluginId"] == "prometheus"
    for name in inputs:  # each answer lands somewhere (the import replaces ${NAME} in every string)
        assert text.count("${" + name + "}") >= 1, f"__inputs {name} is never used"
    [var] = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    assert var["current"].get("value") == "${DS_PROMETHEUS}", "the import's answer must be the variable's default"
    names = {v["name"] for v in dash["templating"]["list"]} | inputs | {"__rate_interval"}
    for used in set(re.findall(r"\$\{?(\w+)", text)):
        assert used in names, f"${used} is neither a variable nor an input"
    for ds in datasources(dash):
        if ds.get("type") != "grafana":
            assert ds == {"type": "prometheus", "uid": "${datasource}"}, ds


def test_the_panels_do_not_overlap_and_have_unique_ids():
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_every_query_uses_exported_series_and_rate_only_over_counters():
    for where, expr in queries(dashboard()):
        used = set(re.findall(r"\bpodguard_[a-z_]+", expr))
        assert used <= EXPORTED, f"{where}: {used - EXPORTED} not exported"
        for fn, arg in re.findall(r"\b(rate|irate|increase|deriv|delta|idelta)\((podguard_[a-z_]+)", expr):
            if fn in ("rate", "irate", "increase"):
                assert arg in COUNTERS, f"{where}: {fn}() of the gauge {arg} (use deriv() for a gauge)"
            else:
                assert arg not in COUNTERS, f"{where}: {fn}() of the counter {arg} (use rate())"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_every_query_parses_as_promql(tmp_path):
    dash = dashboard()
    values = {**GRAFANA_VARS, "job": "podguard", "instance": ".*", "max_cost": "100"}
    rules = []
    for i, (where, expr) in enumerate(queries(dash)):
        expr = re.sub(r"^label_values\((.*), *\w+\)$", r"\1", expr)  # (Grafana's helper around a selector)
        expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
        rules.append({"record": f"podguard:check_{i}", "expr": expr, "labels": {"where": where}})
    path = tmp_path / "rules.json"  # (promtool reads YAML, of which JSON is a part)
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_docs_table_is_the_series_podguard_exports():
    """docs/metrics.md's table of series (name, type, labels) is what the code exports, word for word."""
    text = (DASHBOARD.parents[1] / "metrics.md").read_text()
    rows = re.findall(r"^\| `(podguard_\w+)` \| (gauge|counter) \|([^|]*)\|", text, re.M)
    documented = {(name, kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}
    exported = {(s.name + ("_total" if s.kind == "counter" else ""), s.kind, s.labels) for s in SERIES}
    assert documented == exported


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_the_docs_scrape_config_is_valid_for_prometheus(tmp_path):
    text = (DASHBOARD.parents[1] / "metrics.md").read_text()
    [config] = re.findall(r"```yaml\n(scrape_configs:.*?)```", text, re.S)
    path = tmp_path / "prometheus.yml"
    path.write_text(config)
    check = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "proxy.runpod.net" in config and "scheme: https" in config


ANNOTATION_CASES = {  # annotation -> [(input series every 15 s, the values it gives at 1m over [1m])]
    "Restarts": [
        (  # the first launch after the preflight is not a relaunch
            {"podguard_job_attempt": "0 0 1 1 1 1 1", "podguard_job_restarts_total": "0 0 0 0 0 0 0"},
            [],
        ),
        ({"podguard_job_attempt": "1 1 1 2 2 2 2", "podguard_job_restarts_total": "0 0 0 1 1 1 1"}, [1]),
    ],
    "Fatal GPU faults": [
        ({"podguard_gpu_healthy": "1 1 1 1 1 1 1"}, []),
        ({"podguard_gpu_healthy": "1 1 1 0 0 0 0"}, [1]),
    ],
}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_the_annotations_mark_relaunches_and_faults_only(tmp_path):
    """Each annotation's PromQL evaluated by promtool's rule unit tests over series as podguard exports them."""
    annotations = {a["name"]: a["expr"] for a in dashboard()["annotations"]["list"] if "expr" in a}
    values = {**GRAFANA_VARS, "job": "podguard", "instance": ".*"}
    tests = []
    for name, cases in ANNOTATION_CASES.items():
        expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], annotations[name])
        for series, expected in cases:
            labels = '{instance="pod:9464",job="podguard",gpu="0",uuid="GPU-a",model="H100"}'
            inputs = [{"series": f"{metric}{labels}", "values": v} for metric, v in series.items()]
            samples = [{"labels": "{" + labels[1:], "value": v} for v in expected]
            check = {"expr": expr, "eval_time": "1m", "exp_samples": samples}
            tests.append({"interval": "15s", "input_series": inputs, "promql_expr_test": [check]})
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps({"rule_files": [], "evaluation_interval": "15s", "tests": tests}))
    run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_podguard_selector_picks_one_source():
    """With both --metrics-port and --metrics-file scraped, every series exists twice (`job`/`instance` of the
    endpoint and of node_exporter): a selector without the source draws each line twice and sums stragglers twice."""
    for where, expr in queries(dashboard()):
        if where == "variable job":
            continue  # (the list of sources itself)
        for selector in re.findall(r"\bpodguard_[a-z_]+(\{[^}]*\})?", expr):
            assert 'job="$job"' in selector, f"{where}: {expr}"
            if where != "variable instance":
                assert 'instance=~"$instance"' in selector, f"{where}: {expr}"


def test_the_source_variable_is_one_scrape_job_and_prefers_the_endpoint():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    job = variables["job"]
    assert job["type"] == "query" and job["definition"] == "label_values(podguard_up, job)"
    assert job["multi"] is False and job["includeAll"] is False, "one source at a time"
    assert job["current"]["value"] == "podguard", "the docs' scrape job (the endpoint) when it is there"
    names = [v["name"] for v in dashboard()["templating"]["list"]]
    assert names.index("job") < names.index("instance"), "instance is listed within the source"
    assert variables["instance"]["definition"] == 'label_values(podguard_up{job="$job"}, instance)'


def panel_expr(title: str, values: dict[str, str]) -> str:
    [panel] = [p for p in dashboard()["panels"] if p["title"] == title]
    [target] = panel["targets"]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], target["expr"])


ENDPOINT = '{instance="pod:9464",job="podguard"}'
FILE_COPY = '{instance="pod:9100",job="node"}'


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_one_source_is_drawn_and_the_file_left_after_the_run_stops_the_progress_clock(tmp_path):
    """promtool evaluates the panels over both copies of one run: the endpoint's (job podguard) and the textfile's
    through node_exporter (job node), which stays after the run with podguard_up 0 and its last progress time.
    Each panel counts one copy; after the run "Since last progress" has no value instead of growing for ever."""
    slow = 'podguard_rank_slow{instance="%s",job="%s",rank="%s"}'
    inputs = [
        {"series": slow % ("pod:9464", "podguard", "0"), "values": "1x20"},
        {"series": slow % ("pod:9464", "podguard", "1"), "values": "0x20"},
        {"series": slow % ("pod:9100", "node", "0"), "values": "1x20"},
        {"series": slow % ("pod:9100", "node", "1"), "values": "0x20"},
        {"series": "podguard_job_last_progress_timestamp_seconds" + ENDPOINT, "values": "0+15x4 stale"},  # (closed)
        {"series": "podguard_up" + ENDPOINT, "values": "1x4 stale"},
        {"series": "podguard_job_last_progress_timestamp_seconds" + FILE_COPY, "values": "0+15x4 60x15"},
        {"series": "podguard_up" + FILE_COPY, "values": "1x4 0x15"},  # the run ended at 1m15s
    ]
    checks = []
    for job, instance in (("podguard", "pod:9464"), ("node", "pod:9100")):
        values = {**GRAFANA_VARS, "job": job, "instance": instance}
        stragglers = panel_expr("Stragglers now", values)
        checks.append({"expr": stragglers, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 1}]})
        since = panel_expr("Since last progress", values)
        labels = f'{{instance="{instance}",job="{job}"}}'
        checks.append({"expr": since, "eval_time": "1m", "exp_samples": [{"labels": labels, "value": 0}]})
        checks.append({"expr": since, "eval_time": "4m", "exp_samples": []})  # after the run: no value
    test = {"interval": "15s", "input_series": inputs, "promql_expr_test": checks}
    path = tmp_path / "sources.json"
    path.write_text(json.dumps({"rule_files": [], "evaluation_interval": "15s", "tests": [test]}))
    run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr

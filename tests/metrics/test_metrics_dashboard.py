"""The Grafana dashboard (docs/grafana/podguard-dashboard.json) as Grafana's import and Prometheus read it.

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
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podguard.metrics.series import SERIES

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "podguard-dashboard.json"
EXPORTED = {s.name + ("_total" if s.kind == "counter" else "") for s in SERIES}
COUNTERS = {s.name + "_total" for s in SERIES if s.kind == "counter"}
GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
PROMTOOL = shutil.which("promtool")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target, variable query and annotation."""
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            yield f"variable {var['name']}", var["definition"]
    for ann in dash["annotations"]["list"]:
        if "expr" in ann:
            yield f"annotation {ann['name']!r}", ann["expr"]


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
    values = {**GRAFANA_VARS, "instance": ".*", "max_cost": "100"}
    rules = []
    for i, (where, expr) in enumerate(queries(dash)):
        expr = re.sub(r"^label_values\((.*), *\w+\)$", r"\1", expr)  # (Grafana's helper around a selector)
        expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
        rules.append({"record": f"podguard:check_{i}", "expr": expr, "labels": {"where": where}})
    path = tmp_path / "rules.json"  # (promtool reads YAML, of which JSON is a part)
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr

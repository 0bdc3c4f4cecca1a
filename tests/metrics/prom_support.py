"""Shared pieces of the tests that use Prometheus itself: the dashboard's queries, Grafana's variables filled in,
a real `prometheus` (Debian's package) started on loopback with its own config and data folder, and its HTTP API.

    prom = Prometheus.start(tmp_path, scrape_configs, rule_files=[rules])   # skips nothing: check PROMETHEUS first
    prom.query("up")                          # the result list of an instant query (AssertionError on an error)
    prom.close()
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrics_support import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "podguard-dashboard.json"
DOCS = DASHBOARD.parents[1] / "metrics.md"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


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


def fill(expr: str, values: dict[str, str]) -> str:
    """Grafana's variables ($name, ${name}) replaced by `values`."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def alert_rules() -> str:
    """The rule file in docs/metrics.md (its one YAML block that starts with `groups:`)."""
    [rules] = re.findall(r"```yaml\n(groups:.*?)```", DOCS.read_text(), re.S)
    return rules


def docs_section(title: str) -> str:
    text = DOCS.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def start(
        cls, tmp: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path] = (), every: str = "1s"
    ) -> Prometheus:
        """A real Prometheus on 127.0.0.1 (never its packaged service), scraping and evaluating `every`."""
        assert PROMETHEUS is not None
        config = tmp / "prometheus.yml"  # (Prometheus reads YAML, of which JSON is a part)
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
                    "rule_files": [str(p) for p in rule_files],
                    "scrape_configs": scrape_configs,
                }
            )
        )
        port, log = free_port(), tmp / "prometheus.log"
        args = [
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen([PROMETHEUS, *args], stdout=out, stderr=subprocess.STDOUT)
        prom = cls(proc, port, log)
        prom.wait(prom.ready, "Prometheus to be ready")
        return prom

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def wait(self, cond: Any, what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = cond()
            if got:
                return got
            assert self.proc.poll() is None, f"Prometheus ended: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def api(self, what: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{what}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                answer = json.load(resp)
        except urllib.error.HTTPError as err:
            answer = json.load(err)
        assert answer.get("status") == "success", f"{what} {params}: {answer}"
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

"""Shared pieces of the metrics tests: a heartbeat job, `podguard` started in the background, scrapes parsed with
prometheus_client's own parser, and a free port.

    proc = start(node, ["run", "--metrics-port", str(port), "--", sys.executable, job, str(stop)])
    families = scrape(port)                   # {name: Family} as the official parser reads the text
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

PODGUARD = [sys.executable, "-m", "podguard"]

# heartbeat(step) every 20 ms until the stop file exists; with "hold", SIGTERM does not end it (a worker that
# takes its time to stop), so a test can scrape while the job is ending; with "crash N", exit 1 after N beats
JOB = """
import os, signal, sys, time
from podguard.rank import heartbeat
stop, how = sys.argv[1], sys.argv[2:] or ["run"]
if how[0] == "hold":
    signal.signal(signal.SIGTERM, lambda *_: None)
beats = int(how[1]) if how[0] == "crash" else None
step = 0
while not os.path.exists(stop):
    heartbeat(step)
    step += 1
    if beats is not None and step >= beats:
        time.sleep(0.3)
        sys.exit(1)
    time.sleep(0.02)
"""


def job(tmp_path: Path) -> tuple[str, Path]:
    """The heartbeat job's path and its stop file."""
    path = tmp_path / "beats.py"
    path.write_text(textwrap.dedent(JOB))
    return str(path), tmp_path / "stop"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def start(node, args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*PODGUARD, *args],
        env={**node.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def parse(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def fetch(port: int, timeout: float = 5.0) -> tuple[str, float]:
    """The endpoint's text and how long the request took (seconds)."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    return text, time.perf_counter() - t0


def scrape(port: int) -> dict[str, Metric]:
    return parse(fetch(port)[0])


def values(family: Metric, sample_name: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of a family's samples (of `sample_name` only, where given)."""
    return {
        tuple(sorted(s.labels.items())): s.value for s in family.samples if sample_name is None or s.name == sample_name
    }


def by(family: Metric, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in family.samples}


def wait_for(cond: Callable[[], object], what: str, timeout: float = 30.0, proc=None) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"podguard ended before {what}: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def moved(port: int, name: str, before: dict[str, Metric], proc=None) -> dict[str, Metric]:
    """The first scrape in which the samples of `name` differ from those of `before` (a step, a spend)."""
    return wait_for(  # type: ignore[return-value]
        lambda: (f := scrape(port))[name].samples != before[name].samples and f, f"{name} to move", proc=proc
    )


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def try_scrape(port: int) -> dict[str, Metric] | None:
    try:
        return scrape(port)
    except OSError:
        return None

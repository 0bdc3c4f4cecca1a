"""A picture of the Grafana dashboard's queries over a real podguard run, for docs/metrics.md (not Grafana itself:
Grafana is neither in Debian's archive nor on PyPI, see docs/metrics.md).

    .venv/bin/python docs/grafana/render_preview.py collect /tmp/preview.json   # ~3 min: the run, scraped
    python docs/grafana/render_preview.py plot /tmp/preview.json docs/grafana/podguard-dashboard-preview.png

`collect` runs `podguard train --mode per-gpu --restarts 1 --max-cost 5 --metrics-port` on the test suite's fake
8-GPU node, inside a "pod" of the suite's stand-in RunPod API (its price: the spend), with a real Prometheus
(Debian's `prometheus`) scraping it every 2 s. During the run one rank is slower (a straggler), the GPUs' load and
temperature change, an application Xid comes, rank 0 crashes once (a restart), and a fatal Xid 79 ends the job.
Then every panel's PromQL from podguard-dashboard.json is evaluated by that Prometheus (query_range), with
$__rate_interval = 30s and $max_cost = the run's --max-cost. `plot` draws them in the dashboard's layout with
matplotlib (a separate environment is fine: it needs only matplotlib).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DASHBOARD = HERE / "podguard-dashboard.json"
MAX_COST = 5.0
RATE_INTERVAL = "30s"
UNITS = {
    "percentunit": (100.0, "%"),
    "bytes": (1 / 2**30, "GiB"),
    "watt": (1.0, "W"),
    "celsius": (1.0, "°C"),
    "currencyUSD": (1.0, "USD"),
    "none": (1.0, "steps/s"),
}
COLORS = {"green": "#73bf69", "blue": "#5794f2", "red": "#f2495c", "orange": "#ff9830"}  # Grafana's named colours
KEY = "rpa_PREVIEWKEY0123456789abcdefghijklmnopqrstuv"  # the stand-in's, not a real key
JOB = """
import os, signal, sys, time
from podguard.rank import heartbeat
rank, attempt = int(os.environ["RANK"]), int(os.environ["PODGUARD_RESTART_COUNT"])
stop, started, step = sys.argv[1], time.monotonic(), 0
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0) if time.sleep(4) is None else None)  # a job takes seconds to end
while not os.path.exists(stop):
    heartbeat(step)
    step += 1
    if rank == 0 and attempt == 0 and time.monotonic() - started > 55:
        sys.exit(1)
    time.sleep(0.25 if rank == 5 else 0.1)  # rank 5: a straggler
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def collect(out: Path) -> None:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "pods")]
    from standin_api import StandIn

    from fakenvml.build import build_fake_nvml
    from fakenvml.node import NvmlNode
    from fakenvml.scenario import XidSpec, healthy_h100

    tmp = Path(tempfile.mkdtemp(prefix="podguard-preview-"))
    node = NvmlNode(root=tmp / "node", lib_dir=build_fake_nvml(ROOT / "build" / "fakenvml"), scenario=healthy_h100())
    node.write()
    api = StandIn(KEY).start()
    api.world.set_capacity("NVIDIA A40", 8)
    pod = api.world.create(
        {"name": "trainer", "image": "img", "args": "train", "gpu": {"id": "NVIDIA A40", "count": 8}}
    )
    while pod.status != "RUNNING":
        time.sleep(0.05)
    api.world.backdate(pod.id, 1.3 * 3600)  # $3.52/hr: $4.58 spent when the run starts, the guard at $5
    port, prom_port = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(
        f"global: {{scrape_interval: 2s, evaluation_interval: 2s}}\n"
        f"scrape_configs: [{{job_name: podguard, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n"
    )
    prom = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job, stop = tmp / "job.py", tmp / "stop"
    job.write_text(textwrap.dedent(JOB))
    env = {
        **node.env,
        "PODGUARD_STATE_DIR": str(tmp / "state"),
        "PODGUARD_PROBE": "off",
        "RUNPOD_POD_ID": pod.id,
        "RUNPOD_API_BASE_URL": api.url,
        "RUNPOD_API_KEY": KEY,
    }
    args = ["train", "--mode", "per-gpu", "--restarts", "1", "--max-cost", str(MAX_COST), "--idle-memory-mib", "81559"]
    argv = [sys.executable, "-m", "podguard", *args, "--metrics-port", str(port), "--", sys.executable, str(job)]
    started = time.time()
    log = (tmp / "podguard.log").open("w")  # (a pipe nobody reads fills up and blocks podguard's loop)
    run = subprocess.Popen([*argv, str(stop)], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        drive(node, run, started, XidSpec)
        run.wait(timeout=120)
        time.sleep(6)  # the last scrapes
        end = time.time()
        queries = evaluate(f"http://127.0.0.1:{prom_port}", started, end)
        out.write_text(json.dumps({"start": started, "end": end, "panels": queries}, indent=1))
        print(f"podguard exited {run.returncode} (its output: {log.name}); {len(queries)} panels -> {out}")
    finally:
        stop.touch()
        for proc in (run, prom):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        api.close()
        node.teardown()


def drive(node: Any, run: subprocess.Popen[str], started: float, xid: Any) -> None:
    """Change the node while the job runs: load, power and temperature; an application Xid; a fatal one."""
    events = {40: (3, 13), 150: (6, 79)}
    while run.poll() is None and time.time() - started < 200:
        t = time.time() - started
        for g in node.scenario.gpus:
            busy = 0.0 if t < 8 else 0.9 - 0.05 * g.index + 0.04 * math.sin(t / 7 + g.index)
            g.util_gpu = max(0, min(100, round(100 * busy)))
            g.power_mw = int(90_000 + 560_000 * busy)
            g.temperature_c = int(35 + 30 * busy * (1 - math.exp(-t / 60)) + g.index)
            g.mem_used_mib = 0 if t < 8 else 60_000 + 1_500 * g.index
        for at, (gpu, code) in list(events.items()):
            if t >= at:
                node.scenario.xids.append(xid(gpu=gpu, xid=code))
                del events[at]
        node.write()
        time.sleep(3)


def evaluate(prom: str, start: float, end: float) -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        series = []
        for target in panel["targets"]:
            expr = (
                target["expr"]
                .replace('instance=~"$instance"', 'instance=~".+"')
                .replace('job="$job"', 'job="podguard"')  # (the one source: its scrape config's job_name)
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$max_cost", f"{MAX_COST:g}")
            )
            query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "2"})
            answer = get_json(f"{prom}/api/v1/query_range?{query}")
            if answer.get("status") != "success":
                raise SystemExit(f"{panel['title']}: {expr}: {answer}")
            for result in answer["data"]["result"]:
                series.append({"legend": legend(target["legendFormat"], result["metric"]), "values": result["values"]})
        out.append(
            {
                "title": panel["title"],
                "type": panel["type"],
                "grid": panel["gridPos"],
                "series": series,
                "unit": panel["fieldConfig"]["defaults"].get("unit", ""),
                "mappings": mapped(panel["fieldConfig"]["defaults"].get("mappings", [])),
                "no_value": panel["fieldConfig"]["defaults"].get("noValue", "-"),
            }
        )
    return out


def mapped(mappings: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """A stat panel's value mappings, {"0": {"text": ..., "color": ...}} (Grafana's "value" type only)."""
    out: dict[str, dict[str, str]] = {}
    for mapping in mappings:
        if mapping.get("type") == "value":
            out.update(mapping["options"])
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        fmt = fmt.replace("{{" + key + "}}", value)
    return fmt or labels.get("__name__", "")


def plot(data_path: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(data_path.read_text())
    start = data["start"]
    rows = max(p["grid"]["y"] + p["grid"]["h"] for p in data["panels"])
    fig = plt.figure(figsize=(16, rows * 0.42), facecolor="#111217")
    fig.suptitle(
        "podguard dashboard — its PromQL evaluated by a real Prometheus 2.42 over a real podguard run on the fake "
        "8-GPU node\n(NOT a Grafana screenshot: Grafana is not installable here; drawn with matplotlib in the "
        "dashboard's layout)",
        color="white",
        fontsize=11,
    )
    for panel in data["panels"]:
        g = panel["grid"]
        left, width = 0.045 + g["x"] / 24 * 0.95, g["w"] / 24 * 0.95 - 0.05
        ax = fig.add_axes((left, 1 - (g["y"] + g["h"]) / (rows + 2) - 0.04, width, g["h"] / (rows + 2) - 0.025))
        ax.set_facecolor("#181b1f")
        ax.set_title(panel["title"], color="white", fontsize=9, loc="left")
        ax.tick_params(colors="#aaa", labelsize=7)
        for spine in ax.spines.values():
            spine.set_color("#333")
        if panel["type"] == "stat":
            stat(ax, panel)
            continue
        for s in panel["series"]:
            xs = [(float(t) - start) / 60 for t, _ in s["values"]]
            scale, _ = UNITS.get(panel["unit"], (1.0, ""))
            ys = [float(v) * scale for _, v in s["values"]]
            if s["legend"].startswith("straggler"):
                ax.plot(xs, ys, "o", color="red", markersize=3, label=s["legend"])
            elif s["legend"] == "--max-cost":
                ax.plot(xs, ys, "--", color="red", label=s["legend"])
            else:
                ax.plot(
                    xs,
                    ys,
                    linewidth=1,
                    label=s["legend"],
                    drawstyle="steps-post" if "attempt" in panel["title"].lower() else "default",
                    marker="o" if panel["title"] == "Xid errors" else None,
                    markersize=3,
                )
        if panel["title"] == "Xid errors":
            ax.set_ylim(0, 1 + max((float(v) for s in panel["series"] for _, v in s["values"]), default=0))
        ax.set_xlim(0, (data["end"] - start) / 60)
        ax.set_xlabel("minutes into the run", color="#aaa", fontsize=7)
        ax.set_ylabel(UNITS.get(panel["unit"], (1.0, ""))[1], color="#aaa", fontsize=7)
        if panel["series"]:
            ax.legend(fontsize=6, ncol=4, facecolor="#181b1f", labelcolor="white", loc="upper left")
    fig.savefig(png, dpi=90, facecolor=fig.get_facecolor())
    print(f"wrote {png}")


def stat(ax: Any, panel: dict[str, Any]) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    items = [(s["legend"], float(s["values"][-1][1])) for s in panel["series"] if s["values"]]
    if panel["title"] == "GPU health":
        for i, (name, value) in enumerate(items):
            color = "#2e7d32" if value == 1 else "#c62828"
            ax.add_patch(rect(ax, i / len(items), color, len(items)))
            ax.text(
                (i + 0.5) / len(items),
                0.5,
                f"{name}\n{'healthy' if value == 1 else 'FAULT'}",
                ha="center",
                va="center",
                color="white",
                fontsize=8,
                transform=ax.transAxes,
            )
        return
    unit, mappings, color = panel["unit"], panel.get("mappings", {}), "#73bf69"
    if mappings and items:  # a value mapping (the Run panel: running / ended) names the value and colours it
        shown = mappings.get(f"{items[-1][1]:g}", {})
        text, color = shown.get("text", fmt_value(items[-1][1], unit)), COLORS.get(shown.get("color", ""), color)
    else:
        text = "  ".join(fmt_value(v, unit) if panel["title"] != "podguard" else n for n, v in items)
        text = text or panel.get("no_value", "-")
    ax.text(
        0.5,
        0.45,
        text,
        ha="center",
        va="center",
        color=color,
        fontsize=16 if len(text) < 12 else 9,
        transform=ax.transAxes,
    )


def rect(ax: Any, x: float, color: str, n: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.005, 0.05), 1 / n - 0.01, 0.9, color=color, transform=ax.transAxes)


def fmt_value(value: float, unit: str) -> str:
    if unit == "currencyUSD":
        return f"${value:.2f}"
    if unit == "s":
        return f"{value:.1f} s"
    return f"{value:g}"


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in ("collect", "plot"):
        print(__doc__)
        return 64
    if sys.argv[1] == "collect":
        collect(Path(sys.argv[2]))
    else:
        plot(Path(sys.argv[2]), Path(sys.argv[3]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())

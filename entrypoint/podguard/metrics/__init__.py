"""Metrics where people look: podguard's view of the run, its GPUs and its bill, for Prometheus (docs/metrics.md).

    metrics = open_metrics(port=9464, path=None, mode="auto")   # 64 here when the port is taken or invalid
    metrics.read_price(guards)                                  # inside a pod: its price and spend
    watch = metrics.attempt(runtime, attempt=0, mode="per-gpu", gpus=selection.gpus)   # each launch
    metrics.close()                                             # the port closes; the file keeps its last values

Nothing here polls NVML or the heartbeat board on its own: the run-time watch's state is taken on the supervisor's
loop (watch.py), the GPU gauges are read through the run-time watch's NVML session (state.read_gpus), and a scrape
only formats the latest snapshot (exposition.py).
"""

from podguard.metrics.run import Metrics, open_metrics

__all__ = ["Metrics", "open_metrics"]

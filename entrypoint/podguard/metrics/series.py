"""The series podguard exports (docs/metrics.md, "The series"): name, type, help and labels, in one table.

A counter's name here has no `_total`: the exposition adds it (`podguard_job_restarts` ->
`podguard_job_restarts_total`), as Prometheus's own client does for every counter.

Adding a series is a row here plus its samples from a source, with nothing else to change (the exposition, the
endpoint and the file take every row of SERIES, in order; a row with no samples yet is left out):

    Series("podguard_store_lag_seconds", "gauge", "Age of the newest local whole checkpoint not yet in the store.")
    metrics.add_source(lambda: {"podguard_store_lag_seconds": (((), uploader.lag_s()),)})   # metrics/run.py

A source is called on podguard's loop each time a snapshot is published (every second, and on
`metrics.refresh()`); it returns {series name: ((label values in the row's order, value), ...)} and must not block.
docs/metrics.md's table lists every row (tests/metrics/test_metrics_dashboard.py holds them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU", "GPU_GAUGES", "SERIES", "Series", "names"]


@dataclass(frozen=True)
class Series:
    name: str
    kind: str  # "gauge" | "counter"
    help: str
    labels: tuple[str, ...] = ()


GPU = ("gpu", "uuid")  # the NVML index and the GPU's UUID

SERIES: tuple[Series, ...] = (
    Series("podguard_up", "gauge", "1 while podguard runs; 0 in --metrics-file's last write, after the run."),
    Series(
        "podguard_info",
        "gauge",
        "podguard's version, the launch mode and this RunPod pod's id (empty outside a pod); always 1.",
        ("version", "mode", "pod_id"),
    ),
    Series(
        "podguard_gpu_healthy",
        "gauge",
        "The preflight gate's verdict on each of the job's GPUs (1 healthy), 0 from a fatal fault during the run on.",
        (*GPU, "model"),
    ),
    Series(
        "podguard_gpu_xid_errors",
        "counter",
        "Xid errors NVML reported on each GPU during the run, by Xid (each Xid once per GPU per attempt).",
        (*GPU, "xid"),
    ),
    Series(
        "podguard_gpu_xid_events",
        "counter",
        "Xid events on each watched GPU during the run, every Xid together; 0 from the GPU's first launch on.",
        GPU,
    ),
    Series("podguard_gpu_utilization_ratio", "gauge", "GPU utilisation (NVML's last sample period), 0 to 1.", GPU),
    Series("podguard_gpu_memory_used_bytes", "gauge", "GPU memory in use, in bytes.", GPU),
    Series("podguard_gpu_power_watts", "gauge", "GPU power draw, in watts.", GPU),
    Series("podguard_gpu_temperature_celsius", "gauge", "GPU temperature, in degrees Celsius.", GPU),
    Series("podguard_rank_step", "gauge", "The step of each rank's last heartbeat(step).", ("rank",)),
    Series("podguard_rank_heartbeats", "counter", "Heartbeats each rank has sent.", ("rank",)),
    Series(
        "podguard_rank_last_progress_timestamp_seconds",
        "gauge",
        "When each rank last sent a heartbeat (Unix seconds).",
        ("rank",),
    ),
    Series("podguard_rank_slow", "gauge", "1 while the rank is named a straggler, else 0.", ("rank",)),
    Series(
        "podguard_job_last_progress_timestamp_seconds",
        "gauge",
        "When the job last made progress: a heartbeat or a --progress line (Unix seconds).",
    ),
    Series("podguard_job_attempt", "gauge", "The attempt that runs now (1 = the first launch; 0 = not launched yet)."),
    Series("podguard_job_restarts", "counter", "Relaunches of the job by --restarts."),
    Series("podguard_price_dollars_per_hour", "gauge", "This pod's price, in US dollars per hour (RunPod's API)."),
    Series("podguard_spend_dollars", "gauge", "This pod's spend since it started, in US dollars (price x uptime)."),
    # --checkpoint-store (store/, docs/checkpoints.md "Survive the host")
    Series("podguard_store_checkpoint_step", "gauge", "The step of the newest whole checkpoint in the store."),
    Series(
        "podguard_store_lag_seconds",
        "gauge",
        "Age of the newest whole local checkpoint that is not in the store yet; 0 when none waits.",
    ),
    Series("podguard_store_uploaded_bytes", "counter", "Bytes podguard has sent to the checkpoint store."),
    Series("podguard_store_uploads", "counter", "Checkpoint uploads to the store, by result (ok|failed).", ("result",)),
)

GPU_GAUGES = {  # GpuReading field -> series
    "utilization": "podguard_gpu_utilization_ratio",
    "memory_used": "podguard_gpu_memory_used_bytes",
    "power": "podguard_gpu_power_watts",
    "temperature": "podguard_gpu_temperature_celsius",
}


def names() -> set[str]:
    """Every sample name a scrape can have (counters with `_total`)."""
    return {s.name + ("_total" if s.kind == "counter" else "") for s in SERIES}

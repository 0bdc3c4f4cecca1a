"""A probe's measurements: which keys of its JSON line count as metrics, and how they reach the evidence."""

from __future__ import annotations

from pathlib import Path

from podguard.preflight.gate.probe import run_probes
from podguard.preflight.gate.probe.runner import METRIC_KEYS, metrics_of


def test_only_known_finite_non_negative_numbers_are_metrics():
    line = {
        "matmul_tflops": 701.25,
        "mem_gbps": 2950,
        "h2d_gbps": -1.0,  # a negative bandwidth is a broken measurement, not a slow GPU
        "allreduce_busbw_gbps": True,  # booleans are not numbers here
        "tflops": 9.0,  # unknown keys are not metrics
        "metrics": {"h2d_gbps": 53.1},  # nested metrics count too (and win over the top level)
    }
    assert metrics_of(line) == {"matmul_tflops": 701.25, "mem_gbps": 2950.0, "h2d_gbps": 53.1}
    assert metrics_of({"mem_gbps": float("inf"), "h2d_gbps": "fast"}) == {}
    assert metrics_of(None) == {} and set(METRIC_KEYS) >= set(metrics_of({k: 1 for k in METRIC_KEYS}))


def test_the_last_json_line_of_a_user_probe_counts(tmp_path: Path):
    probe = tmp_path / "probe.sh"
    probe.write_text(
        "#!/bin/sh\n"
        "echo '{\"mem_gbps\": 1}'\n"
        'echo "GPU $PODGUARD_PROBE_GPU_INDEX warming up"\n'
        'echo "{\\"mem_gbps\\": 2000$PODGUARD_PROBE_GPU_INDEX, \\"ok\\": false}"\n'  # ok=false: the exit code decides
    )
    probe.chmod(0o755)
    results = run_probes([(0, "GPU-a"), (1, "GPU-b")], timeout_s=20, probe_cmd=str(probe))
    assert [r.ok for r in results] == [True, True]
    assert [r.metrics for r in results] == [{"mem_gbps": 20000.0}, {"mem_gbps": 20001.0}]
    assert results[0].to_dict()["metrics"] == {"mem_gbps": 20000.0}

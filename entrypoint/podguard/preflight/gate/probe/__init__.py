"""The CUDA health probe (`PODGUARD_PROBE=cuda`) and the user's own probe (`PODGUARD_PROBE_CMD`).

Importing this package never imports torch: only the child processes it starts do.
"""

from podguard.preflight.gate.probe.runner import ProbeResult, cuda_probe_available, cuda_probe_status, run_probes

__all__ = ["ProbeResult", "cuda_probe_available", "cuda_probe_status", "run_probes"]

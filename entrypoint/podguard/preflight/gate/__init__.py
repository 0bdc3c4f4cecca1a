"""The health gate: NVML rules, XID watching and the CUDA probe children."""

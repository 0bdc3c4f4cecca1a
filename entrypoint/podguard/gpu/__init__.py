"""Accelerator access: the backend Protocol, its records, and the NVML implementation."""

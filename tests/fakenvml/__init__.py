"""A fake `libnvidia-ml.so.1` (C, built from NVML's real header) and the helpers tests use with it.

Why: test machines have no GPU and no driver, yet podguard must be tested through the real
`nvidia-ml-py` binding and against real processes. See `fake_nvml.c` (the library), `build.py` (gcc,
cached), `scenario.py` (what the node looks like), `gpuproc.py`/`holders.py` (real stand-in GPU
processes) and `node.py` (one test's node: scenario + /dev folder + registry + environment).
"""

from .build import LIBRARY_NAME, FakeNvmlBuild, FakeNvmlBuildError, build_fake_nvml, find_nvml_header
from .gpuproc import register_process, unregister_process
from .holders import GpuHolder, pid_alive, spawn_gpu_holder, wait_until
from .node import NvmlNode, sync_dev_dir
from .scenario import (
    FIELDS,
    MIB,
    STANDARD_SCENARIOS,
    GpuSpec,
    MigSpec,
    ProcSpec,
    Scenario,
    XidSpec,
    driver_not_loaded,
    ecc_and_remap,
    exclusive_process,
    fewer_gpus,
    fields_unsupported,
    healthy_h100,
    init_failure,
    lost_gpu,
    mig_enabled,
    mig_unprivileged,
    phantom_memory,
    recovery_action,
    remap_failure,
    retired_pages,
    slowdown_thermal_link,
    version_mismatch,
    xid,
)

__all__ = [
    "FIELDS",
    "LIBRARY_NAME",
    "MIB",
    "STANDARD_SCENARIOS",
    "FakeNvmlBuild",
    "FakeNvmlBuildError",
    "GpuHolder",
    "GpuSpec",
    "MigSpec",
    "NvmlNode",
    "ProcSpec",
    "Scenario",
    "XidSpec",
    "build_fake_nvml",
    "driver_not_loaded",
    "ecc_and_remap",
    "exclusive_process",
    "fewer_gpus",
    "fields_unsupported",
    "find_nvml_header",
    "healthy_h100",
    "init_failure",
    "lost_gpu",
    "mig_enabled",
    "mig_unprivileged",
    "phantom_memory",
    "pid_alive",
    "recovery_action",
    "register_process",
    "remap_failure",
    "retired_pages",
    "slowdown_thermal_link",
    "spawn_gpu_holder",
    "sync_dev_dir",
    "unregister_process",
    "version_mismatch",
    "wait_until",
    "xid",
]

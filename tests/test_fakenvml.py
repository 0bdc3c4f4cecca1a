"""The fake libnvidia-ml.so.1 and its helpers, exercised through the real `pynvml` binding.

Why: every NVML-level test in the suite trusts this fake, so its own behaviour is pinned here — the
build (real header, cache), the exported symbols pynvml resolves, scenario reloading, real-PID process
reporting (zombies, recycled PIDs, forked children, release delay), XID delivery, and the stand-in GPU
processes (SIGTERM-ignoring, monitor, respawning launcher, new session).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pynvml
import pytest

from fakenvml import (
    FIELDS,
    LIBRARY_NAME,
    MIB,
    STANDARD_SCENARIOS,
    FakeNvmlBuild,
    GpuSpec,
    NvmlNode,
    Scenario,
    build_fake_nvml,
    find_nvml_header,
    healthy_h100,
    pid_alive,
    register_process,
    unregister_process,
    wait_until,
    xid,
)
from fakenvml.build import VARIANTS

REPO = Path(__file__).resolve().parent.parent

# Every symbol NvmlBackend reaches through pynvml (see podguard/gpu/nvml.py), by the exact name pynvml
# resolves: versioned where pynvml calls the versioned symbol.
REQUIRED_SYMBOLS = (
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetFieldValues",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)
OLD_DRIVER_MISSING = (
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrentClocksEventReasons",
)


@pytest.fixture
def nv(nvml_node: NvmlNode) -> object:
    """pynvml initialised on the node's fake (in-process), shut down afterwards."""
    nvml_node.backend()  # binds pynvml to the fake library and initialises NVML
    return pynvml


def procs_of(gpu: int) -> list[tuple[int, int]]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    return [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)]


def used(gpu: int) -> int:
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)


# ---------------------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------------------


def test_header_comes_from_the_nvidia_nvml_dev_wheel() -> None:
    header = find_nvml_header()
    assert header.name == "nvml.h" and "nvidia" in header.parts
    assert "nvmlDeviceGetMemoryInfo_v2" in header.read_text(errors="replace")


def test_build_is_cached_by_source_hash(fake_nvml: FakeNvmlBuild, tmp_path: Path) -> None:
    lib = fake_nvml.library
    assert lib.name == LIBRARY_NAME and lib.is_file()
    mtime = lib.stat().st_mtime_ns
    t0 = time.perf_counter()
    again = build_fake_nvml(fake_nvml.lib_dir.parent, "current")
    assert again == fake_nvml.lib_dir and lib.stat().st_mtime_ns == mtime
    assert time.perf_counter() - t0 < 0.5
    with pytest.raises(ValueError, match="valid: current, old"):
        build_fake_nvml(tmp_path, "nope")
    assert set(VARIANTS) == {"current", "old"}


def test_build_entry_point(fake_nvml: FakeNvmlBuild) -> None:
    dest = fake_nvml.lib_dir.parent
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fakenvml.build", str(dest)], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == fake_nvml.lib_dir


def test_exported_symbols(fake_nvml: FakeNvmlBuild, fake_nvml_old: FakeNvmlBuild) -> None:
    lib = ctypes.CDLL(str(fake_nvml.library))
    missing = [s for s in REQUIRED_SYMBOLS if not hasattr(lib, s)]
    assert missing == []
    old = ctypes.CDLL(str(fake_nvml_old.library))
    assert [s for s in OLD_DRIVER_MISSING if hasattr(old, s)] == []
    assert hasattr(old, "nvmlDeviceGetCurrentClocksThrottleReasons") and hasattr(old, "nvmlDeviceGetMemoryInfo")


# ---------------------------------------------------------------------------------------------------------
# The binding against the fake
# ---------------------------------------------------------------------------------------------------------


def test_pynvml_reads_the_scenario(nvml_node: NvmlNode, nv: object) -> None:
    assert pynvml.nvmlDeviceGetCount() == 8
    h = pynvml.nvmlDeviceGetHandleByIndex(7)
    spec = nvml_node.scenario.gpus[7]
    assert pynvml.nvmlDeviceGetUUID(h) == spec.uuid
    assert pynvml.nvmlDeviceGetPciInfo_v3(h).busId == spec.pci_bus_id  # pynvml decodes char arrays
    assert pynvml.nvmlDeviceGetPciInfo_v3(h).bus == 0xDB
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(spec.uuid)) == 7
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId("0000:DB:00.0")) == 7
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert v1.used == 530 * MIB and v1.total == v1.used + v1.free


def test_memory_v2_struct_version_is_checked(nv: object) -> None:
    """The fake rejects a wrong struct version like the driver, so pynvml's nvmlMemory_v2 must match the
    header's NVML_STRUCT_VERSION(Memory, 2)."""
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as info:
        pynvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)
    assert info.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total == 81559 * MIB


def test_calls_before_init_are_uninitialized(nvml_node: NvmlNode) -> None:
    lib = ctypes.CDLL(str(nvml_node.library))
    count = ctypes.c_uint()
    if lib.fakeNvmlInitCount() == 0:
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == pynvml.NVML_ERROR_UNINITIALIZED
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == b"GPU is lost"


def test_scenario_changes_are_seen_without_reinit(nvml_node: NvmlNode, nv: object) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 33
    nvml_node.scenario.gpus[0].temperature_c = 71
    nvml_node.write()  # atomic replace: new inode, noticed on the next call
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 71
    nvml_node.write(healthy_h100(2))
    assert pynvml.nvmlDeviceGetCount() == 2


def test_unsupported_and_failing_fields(nvml_node: NvmlNode, nv: object) -> None:
    sc = healthy_h100(1)
    sc.gpus[0].unsupported = {"ecc_mode"}
    sc.gpus[0].fail = {"temperature": "UNKNOWN"}
    nvml_node.write(sc)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEccMode(h)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)


def test_scenario_validation() -> None:
    with pytest.raises(ValueError, match="unknown fields"):
        Scenario(gpus=[GpuSpec(index=0, unsupported={"ecc"})]).to_text()
    with pytest.raises(ValueError, match="compute_mode"):
        Scenario(gpus=[GpuSpec(index=0, compute_mode="SHARED")]).to_text()
    with pytest.raises(ValueError, match="indices"):
        Scenario(gpus=[GpuSpec(index=1)]).to_text()
    assert "recovery_action" in FIELDS and "handle" in FIELDS


@pytest.mark.parametrize("name", sorted(STANDARD_SCENARIOS))
def test_every_standard_scenario_loads(nvml_node: NvmlNode, name: str) -> None:
    sc = STANDARD_SCENARIOS[name]()
    nvml_node.write(sc)
    if sc.init_error:
        with pytest.raises(pynvml.NVMLError) as info:
            pynvml.nvmlInit()
        assert info.value.value == getattr(pynvml, f"NVML_ERROR_{sc.init_error}")
        return
    backend = nvml_node.backend()
    assert backend.device_count() == sc.gpu_count
    snaps = [backend.snapshot(i) for i in range(sc.gpu_count)]
    assert all(s.errors == () for s in snaps)
    assert [s.lost for s in snaps] == [g.lost for g in sc.gpus]
    assert sorted(p.name for p in nvml_node.dev_dir.iterdir()) == sorted(
        ["nvidiactl", "nvidia-uvm", *(f"nvidia{g.minor}" for g in sc.gpus)]
    )


# ---------------------------------------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------------------------------------


def test_registered_process_counts_only_while_alive(nvml_node: NvmlNode, nv: object) -> None:
    holder = nvml_node.spawn_holder(0, 1500)
    assert procs_of(0) == [(holder.pid, 1500 * MIB)]
    assert used(0) == 1500 * MIB
    registry = (nvml_node.procs_dir / str(holder.pid)).read_text()
    assert registry.startswith("gpu=0 mem_mib=1500 kind=compute start=")
    holder.kill()
    assert wait_until(lambda: used(0) == 0, 2.0)  # a zombie is gone for the driver
    assert procs_of(0) == []
    holder.wait()


def test_recycled_pid_does_not_resurrect_a_holder(nvml_node: NvmlNode, nv: object) -> None:
    path = register_process(nvml_node.procs_dir, os.getpid(), 0, 100)
    assert procs_of(0) == [(os.getpid(), 100 * MIB)]
    text = path.read_text()
    start = int(text.split("start=")[1].split()[0])
    path.write_text(text.replace(f"start={start}", f"start={start + 1}"))  # another process, same PID
    nvml_node.write()  # (any change; the registry itself is read on every query)
    assert procs_of(0) == []
    unregister_process(nvml_node.procs_dir, os.getpid())
    assert not path.exists()


def test_multi_gpu_registration(nvml_node: NvmlNode, nv: object) -> None:
    register_process(nvml_node.procs_dir, os.getpid(), [1, 2], 64)
    assert procs_of(1) == procs_of(2) == [(os.getpid(), 64 * MIB)]
    unregister_process(nvml_node.procs_dir, os.getpid())
    assert procs_of(1) == []


def test_forked_child_keeps_the_memory_but_is_not_listed(nvml_node: NvmlNode, nv: object) -> None:
    holder = nvml_node.spawn_holder(2, 3000, fork_child_holder=True)
    child = holder.child_pid
    assert child and pid_alive(child)
    assert procs_of(2) == [(holder.pid, 3000 * MIB)]
    assert _fd_targets(child) >= {"nvidiactl", "nvidia2"}  # inherited device files
    holder.kill()
    holder.wait()
    assert procs_of(2) == []
    assert used(2) == 3000 * MIB  # still held through the child's open device file
    os.kill(child, signal.SIGKILL)
    assert wait_until(lambda: used(2) == 0, 2.0)


def test_release_delay_keeps_memory_briefly(nvml_node: NvmlNode, nv: object) -> None:
    nvml_node.scenario.release_delay_ms = 150
    nvml_node.write()
    holder = nvml_node.spawn_holder(0, 1000)
    holder.kill()
    holder.wait()
    t0 = time.monotonic()
    assert procs_of(0) == []  # gone from the list at once
    assert used(0) == 1000 * MIB  # memory still being released
    assert wait_until(lambda: used(0) == 0, 2.0)
    assert time.monotonic() - t0 >= 0.14


def test_xid_delivery_through_pynvml(nvml_node: NvmlNode, nv: object) -> None:
    nvml_node.write(xid(gpu=3, code=79, after_ms=150))
    es = pynvml.nvmlEventSetCreate()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(3)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(es, 5)  # not due yet
        t0 = time.monotonic()
        data = pynvml.nvmlEventSetWait_v2(es, 1000)
        assert time.monotonic() - t0 < 0.5
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
        assert pynvml.nvmlDeviceGetIndex(data.device) == 3
        t0 = time.monotonic()
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(es, 40)  # delivered once
        assert 0.035 <= time.monotonic() - t0 < 1.0
    finally:
        pynvml.nvmlEventSetFree(es)


def test_pynvml_in_a_subprocess_via_ld_library_path(nvml_node: NvmlNode) -> None:
    """A real user's process: nothing but LD_LIBRARY_PATH makes pynvml find the fake."""
    holder = nvml_node.spawn_holder(4, 700)
    code = textwrap.dedent(
        """
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(4)
        print(pynvml.nvmlDeviceGetName(h), [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])
        pynvml.nvmlShutdown()
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], env=nvml_node.env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"NVIDIA H100 80GB HBM3 [{holder.pid}]"


# ---------------------------------------------------------------------------------------------------------
# Stand-in GPU processes
# ---------------------------------------------------------------------------------------------------------


def _fd_targets(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.path.basename(os.readlink(f"/proc/{pid}/fd/{fd}")))
        except OSError:
            continue
    return out


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_holder_opens_the_device_files(nvml_node: NvmlNode) -> None:
    holder = nvml_node.spawn_holder(5, 100)
    assert {"nvidiactl", "nvidia-uvm", "nvidia5"} <= _fd_targets(holder.pid)
    assert "nvidia4" not in _fd_targets(holder.pid)


def test_holder_that_ignores_sigterm(nvml_node: NvmlNode) -> None:
    holder = nvml_node.spawn_holder(0, 100, ignore_sigterm=True)
    holder.terminate()
    with pytest.raises(subprocess.TimeoutExpired):
        holder.wait(timeout=0.05)
    assert pid_alive(holder.pid)
    holder.kill()
    assert holder.wait(timeout=2) == -signal.SIGKILL


def test_monitor_holds_only_nvidiactl_and_is_not_listed(nvml_node: NvmlNode, nv: object) -> None:
    monitor = nvml_node.spawn_holder(0, 100, monitor=True, name="dcgm-exporter")
    targets = _fd_targets(monitor.pid)
    assert "nvidiactl" in targets and not any(t.startswith("nvidia") and t[6:].isdigit() for t in targets)
    assert _comm(monitor.pid) == "dcgm-exporter"
    assert procs_of(0) == []


def test_bystander_holds_nothing(nvml_node: NvmlNode, nv: object) -> None:
    sshd = nvml_node.spawn_holder(0, 0, bystander=True, name="sshd")
    assert _comm(sshd.pid) == "sshd"
    assert not any(t.startswith("nvidia") for t in _fd_targets(sshd.pid))
    assert procs_of(0) == []


def test_unregistered_holder_is_invisible_to_nvml(nvml_node: NvmlNode, nv: object) -> None:
    holder = nvml_node.spawn_holder(1, 100, register=False)
    assert "nvidia1" in _fd_targets(holder.pid)
    assert procs_of(1) == []


def test_launcher_respawns_its_worker(nvml_node: NvmlNode, nv: object) -> None:
    launcher = nvml_node.spawn_holder(6, 900, respawn_worker=True)
    assert _comm(launcher.pid) == "torchrun"
    assert Path(f"/proc/{launcher.pid}/cmdline").read_bytes().split(b"\0")[0] == b"torchrun"
    first = launcher.holder_pid
    assert first != launcher.pid and procs_of(6) == [(first, 900 * MIB)]
    assert "nvidia6" not in _fd_targets(launcher.pid)  # the agent itself holds no GPU
    os.kill(first, signal.SIGKILL)
    second = launcher.wait_for_respawn(first)
    assert wait_until(lambda: procs_of(6) == [(second, 900 * MIB)], 2.0)
    assert launcher.worker_pids() == [first, second]
    # SIGTERM to the agent: it stops its worker and exits, nothing is respawned.
    launcher.terminate()
    assert launcher.wait(timeout=5) == 128 + signal.SIGTERM
    assert wait_until(lambda: not pid_alive(second), 2.0)
    assert wait_until(lambda: used(6) == 0, 2.0)


def test_holder_in_a_new_session(nvml_node: NvmlNode, nv: object) -> None:
    holder = nvml_node.spawn_holder(7, 100, new_session=True)
    assert os.getsid(holder.pid) == holder.pid != os.getsid(0)
    assert procs_of(7) == [(holder.pid, 100 * MIB)]


def test_kill_all_stops_the_whole_family(nvml_node: NvmlNode) -> None:
    parent = nvml_node.spawn_holder(0, 100, fork_child_holder=True, ignore_sigterm=True)
    launcher = nvml_node.spawn_holder(1, 100, respawn_worker=True)
    pids = parent.known_pids() + launcher.known_pids()
    assert len(pids) == 4
    parent.kill_all()
    launcher.kill_all()
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 2.0)

"""NvmlBackend on the real `nvidia-ml-py` binding against the fake libnvidia-ml.so.1.

Why these tests: they pin the contract the rest of podguard relies on — every standard scenario gives the
right GpuSnapshot, init failures are classified, unsupported fields degrade to n/a, real holder processes
appear and disappear with their memory, XID watching respects its window, and the cheap polls stay cheap.
In-process tests load the fake by path (PODGUARD_NVML_LIBRARY); the subprocess tests use only
LD_LIBRARY_PATH, as a real user's process would.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fakenvml import (
    MIB,
    FakeNvmlBuild,
    GpuSpec,
    NvmlNode,
    ProcSpec,
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
    wait_until,
    without_nvlink,
    xid,
)
from podguard.gpu.backend import ComputeMode, GpuBackend, GpuQueryError, NvmlFailure, NvmlUnavailable
from podguard.gpu.nvml import NvmlBackend, classify_init_error, format_cuda_version

REPO = Path(__file__).resolve().parents[2]
NONEXISTENT_PID = 4_194_000  # above any pid_max default: a host PID that cannot exist here


def fake_ctl(node: NvmlNode) -> ctypes.CDLL:
    """The fake's test-only symbols (same library instance pynvml uses: dlopen by the same path)."""
    lib = ctypes.CDLL(str(node.library))
    lib.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    return lib


def run_python(code: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


# ---------------------------------------------------------------------------------------------------------
# Initialisation and lifecycle
# ---------------------------------------------------------------------------------------------------------


def test_backend_satisfies_protocol_and_reports_driver(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    assert isinstance(backend, GpuBackend)
    info = backend.driver()
    assert (info.driver_version, info.cuda_driver_version, info.nvml_version) == ("550.54.15", "12.4", "12.550.54.15")
    assert backend.device_count() == 8


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("DRIVER_NOT_LOADED", NvmlFailure.DRIVER_NOT_LOADED),
        ("LIB_RM_VERSION_MISMATCH", NvmlFailure.VERSION_MISMATCH),
        ("GPU_IS_LOST", NvmlFailure.GPU_LOST),
        ("NO_PERMISSION", NvmlFailure.NO_PERMISSION),
        ("INSUFFICIENT_RESOURCES", NvmlFailure.INSUFFICIENT_RESOURCES),
        ("IRQ_ISSUE", NvmlFailure.UNKNOWN),
        ("UNKNOWN", NvmlFailure.UNKNOWN),
    ],
)
def test_init_failures_are_classified(nvml_node: NvmlNode, error: str, kind: NvmlFailure) -> None:
    nvml_node.write(init_failure(error))
    before = fake_ctl(nvml_node).fakeNvmlInitCount()
    with pytest.raises(NvmlUnavailable) as info:
        NvmlBackend(library_path=nvml_node.library)
    assert info.value.kind is kind
    assert info.value.detail  # NVML's own words are kept for the user
    assert fake_ctl(nvml_node).fakeNvmlInitCount() == before  # a failed init leaves nothing to shut down


def test_standard_init_scenarios(nvml_node: NvmlNode) -> None:
    nvml_node.write(version_mismatch())
    with pytest.raises(NvmlUnavailable, match="version mismatch") as info:
        NvmlBackend(library_path=nvml_node.library)
    assert info.value.kind is NvmlFailure.VERSION_MISMATCH


def test_close_shuts_nvml_down_exactly_once(nvml_node: NvmlNode) -> None:
    ctl = fake_ctl(nvml_node)
    before = ctl.fakeNvmlInitCount()
    backend = NvmlBackend(library_path=nvml_node.library)
    assert ctl.fakeNvmlInitCount() == before + 1
    backend.close()
    backend.close()
    assert ctl.fakeNvmlInitCount() == before
    with NvmlBackend(library_path=nvml_node.library):
        assert ctl.fakeNvmlInitCount() == before + 1
    assert ctl.fakeNvmlInitCount() == before


def test_helpers() -> None:
    assert format_cuda_version(12040) == "12.4"
    assert format_cuda_version(11080) == "11.8"
    assert format_cuda_version(None) is None
    assert classify_init_error(12) is NvmlFailure.LIBRARY_NOT_FOUND
    assert classify_init_error(None) is NvmlFailure.UNKNOWN


# ---------------------------------------------------------------------------------------------------------
# Snapshots for the standard scenarios
# ---------------------------------------------------------------------------------------------------------


def test_healthy_h100_snapshot(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    snaps = [backend.snapshot(i) for i in range(8)]
    spec = nvml_node.scenario.gpus
    assert [s.pci_bus_id for s in snaps] == [g.pci_bus_id for g in spec]
    assert len({s.uuid for s in snaps}) == 8
    s = snaps[0]
    assert s.name == "NVIDIA H100 80GB HBM3"
    assert s.uuid == spec[0].uuid and s.uuid.startswith("GPU-")
    assert s.pci_bus_id == "00000000:18:00.0"
    assert s.minor_number == 0
    assert s.memory_total == 81559 * MIB
    assert s.memory_reserved == 530 * MIB
    assert s.memory_used == 0
    assert s.memory_free == (81559 - 530) * MIB
    assert (s.utilization_gpu, s.utilization_memory) == (0, 0)
    assert s.processes == ()
    assert s.compute_mode is ComputeMode.DEFAULT
    assert s.persistence_mode is True
    assert s.mig_enabled is False and s.mig_devices == ()
    assert s.ecc.enabled is True
    assert (s.ecc.uncorrected_volatile, s.ecc.corrected_volatile) == (0, 0)
    assert (s.ecc.uncorrected_aggregate, s.ecc.corrected_aggregate) == (0, 0)
    assert s.ecc.retired_pages_pending is False
    assert (s.ecc.remap_pending, s.ecc.remap_failure) == (False, False)
    assert (s.ecc.remapped_rows_correctable, s.ecc.remapped_rows_uncorrectable) == (0, 0)
    assert s.clock_event_reasons == 0x1 and s.clock_event_names == ("gpu_idle",)
    assert (s.temperature_c, s.temperature_slowdown_c) == (33, 87)
    assert (s.pcie_link_width, s.pcie_link_width_max) == (16, 16)
    assert s.recovery_action == "none"
    assert s.lost is False and s.errors == ()
    assert json.dumps(s.to_dict())  # serialisable for the JSON report


def test_fewer_gpus_than_expected(nvml_node: NvmlNode) -> None:
    nvml_node.write(fewer_gpus(4))
    backend = nvml_node.backend()
    assert backend.device_count() == 4
    with pytest.raises(IndexError, match=r"valid: 0\.\.3"):
        backend.snapshot(4)


def test_exclusive_process_with_a_live_context(nvml_node: NvmlNode) -> None:
    nvml_node.write(exclusive_process(gpu=0))
    holder = nvml_node.spawn_holder(0, 2048)
    s = nvml_node.backend().snapshot(0)
    assert s.compute_mode is ComputeMode.EXCLUSIVE_PROCESS
    assert [p.pid for p in s.processes] == [holder.pid]
    assert s.memory_used == 2048 * MIB


def test_phantom_memory_has_no_process(nvml_node: NvmlNode) -> None:
    nvml_node.write(phantom_memory(gpu=2, mib=2048))
    backend = nvml_node.backend()
    s = backend.snapshot(2)
    assert s.memory_used == 2048 * MIB and s.processes == ()
    assert backend.memory_used(1) == 0


def test_ecc_and_row_remap(nvml_node: NvmlNode) -> None:
    nvml_node.write(ecc_and_remap(ecc_gpu=1, remap_gpu=2))
    backend = nvml_node.backend()
    ecc = backend.snapshot(1).ecc
    assert (ecc.uncorrected_volatile, ecc.corrected_volatile, ecc.uncorrected_aggregate) == (2, 14, 2)
    assert ecc.remap_pending is False
    remap = backend.snapshot(2).ecc
    assert remap.remap_pending is True and remap.remapped_rows_uncorrectable == 1
    assert remap.uncorrected_volatile == 0


def test_remap_failure_and_retired_pages(nvml_node: NvmlNode) -> None:
    nvml_node.write(remap_failure(gpu=0))
    assert nvml_node.backend().snapshot(0).ecc.remap_failure is True
    nvml_node.write(retired_pages(gpu=3))
    backend = nvml_node.backend()
    assert backend.snapshot(3).ecc.retired_pages_pending is True
    assert backend.snapshot(2).ecc.retired_pages_pending is False


def test_lost_gpu_from_the_start(nvml_node: NvmlNode) -> None:
    nvml_node.write(lost_gpu(gpu=5))
    backend = nvml_node.backend()
    s = backend.snapshot(5)
    assert s.lost is True and s.index == 5 and s.errors == ()
    assert s.name is None and s.memory_used is None
    assert backend.snapshot(4).lost is False
    assert backend.memory_used(5) is None
    with pytest.raises(GpuQueryError, match="GPU_IS_LOST"):  # unknown, not "no process"
        backend.processes(5)


def test_gpu_lost_while_running_keeps_what_it_can_read(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    assert backend.snapshot(5).lost is False  # handle cached while the GPU was fine
    nvml_node.scenario.gpus[5].lost = True
    nvml_node.write()
    s = backend.snapshot(5)
    assert s.lost is True
    assert s.pci_bus_id == nvml_node.scenario.gpus[5].pci_bus_id  # the driver still knows where it was
    assert s.uuid is None and s.memory_used is None and s.temperature_c is None
    assert s.errors == ()


def test_mig_enabled(nvml_node: NvmlNode) -> None:
    sc = nvml_node.write(mig_enabled(gpu=0, devices=2))
    s = nvml_node.backend().snapshot(0)
    assert s.mig_enabled is True
    assert [m.uuid for m in s.mig_devices] == [m.uuid for m in sc.gpus[0].mig_devices]
    assert all(m.uuid.startswith("MIG-") for m in s.mig_devices)
    assert [(m.gpu_instance_id, m.compute_instance_id) for m in s.mig_devices] == [(1, 0), (2, 0)]
    assert s.utilization_gpu is None  # n/a in MIG mode, not an error
    assert s.errors == ()


def test_mig_devices_have_their_own_processes_and_memory_the_parent_may_not(nvml_node: NvmlNode) -> None:
    """Issue 7 items 3/4: per-MIG-device process lists; an unreadable parent is unknown, not idle."""
    sc = nvml_node.write(mig_unprivileged(gpu=0, devices=2))
    slice0, slice1 = (m.uuid for m in sc.gpus[0].mig_devices)
    holder = nvml_node.spawn_holder(0, 3000, mig=1)
    backend = nvml_node.backend()
    s = backend.snapshot(0)
    assert s.memory_used is None and s.processes == ()
    assert s.unknown == ("memory: NO_PERMISSION", "processes: NO_PERMISSION")
    by_uuid = {m.uuid: m for m in s.mig_devices}
    assert by_uuid[slice0].processes == () and by_uuid[slice0].memory_used == 0 and by_uuid[slice0].unknown == ()
    (p,) = by_uuid[slice1].processes
    assert (p.pid, p.used_memory, p.mig) == (holder.pid, 3000 * MIB, slice1)
    assert by_uuid[slice1].memory_used == 3000 * MIB
    with pytest.raises(GpuQueryError, match="NO_PERMISSION"):
        backend.processes(0)
    assert backend.memory_used(0) is None
    assert [q.pid for q in backend.processes(0, mig=slice1)] == [holder.pid]
    assert backend.processes(0, mig=slice0) == () and backend.memory_used(0, mig=slice1) == 3000 * MIB


def test_slowdown_thermal_and_pcie_link(nvml_node: NvmlNode) -> None:
    nvml_node.write(slowdown_thermal_link(gpu=0))
    s = nvml_node.backend().snapshot(0)
    assert "hw_slowdown" in s.clock_event_names and "hw_thermal" in s.clock_event_names
    assert s.temperature_c == s.temperature_slowdown_c == 87
    assert (s.pcie_link_width, s.pcie_link_width_max) == (8, 16)


def test_pcie_generation_and_nvlink_links(nvml_node: NvmlNode) -> None:
    sc = healthy_h100(3)
    sc.gpus[1].pcie_gen = 1  # power saving at idle
    sc.gpus[2].nvlink_down = {0, 17}
    nvml_node.write(sc)
    backend = nvml_node.backend()
    s0, s1, s2 = (backend.snapshot(i) for i in range(3))
    assert (s0.pcie_link_gen, s0.pcie_link_gen_max, s1.pcie_link_gen) == (5, 5, 1)
    assert (s0.nvlink_links, s0.nvlink_active, s2.nvlink_links, s2.nvlink_active) == (18, 18, 18, 16)
    assert s0.errors == () and s2.errors == ()
    nvml_node.write(without_nvlink(1))
    s = nvml_node.backend().snapshot(0)  # the link count is the hardware's: a backend reads it once per GPU
    assert (s.nvlink_links, s.nvlink_active, s.errors) == (None, None, ())


def test_nvlink_state_takes_one_field_values_call_and_none_without_nvlink(nvml_node: NvmlNode) -> None:
    ctl = ctypes.CDLL(str(nvml_node.library))
    ctl.fakeNvmlCallCount.restype = ctypes.c_ulonglong

    def second_snapshot_calls() -> int:
        backend = nvml_node.backend()
        backend.snapshot(0)  # handles and the link count are read once
        start = ctl.fakeNvmlCallCount()
        backend.snapshot(0)
        return ctl.fakeNvmlCallCount() - start

    nvml_node.write(healthy_h100(1))
    with_nvlink = second_snapshot_calls()
    nvml_node.write(without_nvlink(1))
    assert with_nvlink - second_snapshot_calls() == 1  # 18 link states in one call, not 18 calls


def test_nvlink_query_failures_are_unknown_not_down(nvml_node: NvmlNode) -> None:
    sc = healthy_h100(1)
    sc.gpus[0].fail = {"nvlink": "NO_PERMISSION"}
    nvml_node.write(sc)
    s = nvml_node.backend().snapshot(0)
    assert (s.nvlink_links, s.nvlink_active, s.errors) == (None, None, ())


def test_recovery_action(nvml_node: NvmlNode) -> None:
    nvml_node.write(recovery_action(gpu=1, action=2))
    backend = nvml_node.backend()
    assert backend.snapshot(1).recovery_action == "reboot"
    assert backend.snapshot(0).recovery_action == "none"


# ---------------------------------------------------------------------------------------------------------
# Degradation: n/a, never a crash
# ---------------------------------------------------------------------------------------------------------


def test_unsupported_fields_are_na(nvml_node: NvmlNode) -> None:
    nvml_node.write(fields_unsupported())
    backend = nvml_node.backend()
    s = backend.snapshot(0)
    assert s.name == "NVIDIA GeForce RTX 4090"
    assert s.ecc.enabled is None and s.ecc.uncorrected_volatile is None
    assert s.ecc.retired_pages_pending is None and s.ecc.remap_pending is None
    assert s.mig_enabled is None and s.persistence_mode is None and s.recovery_action is None
    assert s.memory_total == 24564 * MIB and s.temperature_c == 33  # what is supported is still read
    assert s.errors == () and s.lost is False
    assert backend.driver().cuda_driver_version == "12.2"
    assert backend.watch_xid([0, 1], 0.05) == []  # events unsupported: nothing, after the window


def test_every_field_unsupported_gives_an_empty_snapshot(nvml_node: NvmlNode) -> None:
    from fakenvml import FIELDS

    sc = healthy_h100(1)
    sc.gpus[0].unsupported = set(FIELDS) - {"handle"}
    nvml_node.write(sc)
    s = nvml_node.backend().snapshot(0)
    assert s.errors == () and s.lost is False
    assert s.name is None and s.uuid is None and s.memory_used is None and s.processes == ()
    assert s.compute_mode is None and s.clock_event_reasons is None and s.recovery_action is None


def test_unexpected_errors_are_recorded_not_raised(nvml_node: NvmlNode) -> None:
    sc = healthy_h100(2)
    sc.gpus[0].fail = {"temperature": "UNKNOWN", "ecc_mode": "CORRUPTED_INFOROM", "recovery_action": "TIMEOUT"}
    nvml_node.write(sc)
    s = nvml_node.backend().snapshot(0)
    assert s.temperature_c is None and s.ecc.enabled is None and s.recovery_action is None
    assert len(s.errors) == 3
    assert any(e.startswith("temperature:") and "Unknown Error" in e for e in s.errors)
    assert any(e.startswith("ecc_mode:") for e in s.errors)
    assert any(e.startswith("recovery_action:") for e in s.errors)
    assert s.memory_total is not None  # the rest of the snapshot is intact


def test_missing_symbol_in_binding_degrades(nvml_node: NvmlNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml raises FunctionNotFound for a symbol the driver lacks: the field is n/a, with a fallback
    to the older symbol where one exists (clock throttle reasons)."""
    import pynvml

    backend = nvml_node.backend()

    def missing(*args: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", missing)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetRemappedRows", missing)
    s = backend.snapshot(0)
    assert s.clock_event_reasons == 0x1  # from nvmlDeviceGetCurrentClocksThrottleReasons
    assert s.ecc.remap_pending is None
    assert s.errors == ()


# ---------------------------------------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------------------------------------


def test_real_holder_appears_then_memory_returns_when_it_dies(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    holder = nvml_node.spawn_holder(3, 4096)
    procs = backend.processes(3)
    assert [(p.pid, p.used_memory, p.kind) for p in procs] == [(holder.pid, 4096 * MIB, "compute")]
    assert backend.memory_used(3) == 4096 * MIB
    assert backend.snapshot(3).processes == procs
    assert backend.processes(2) == ()
    holder.kill()  # not reaped: a zombie already counts as gone, like the driver
    assert wait_until(lambda: backend.memory_used(3) == 0, timeout=2.0)
    assert backend.processes(3) == ()
    holder.wait()


def test_host_pid_and_graphics_processes(nvml_node: NvmlNode) -> None:
    sc = healthy_h100(2)
    sc.procs = [
        ProcSpec(pid=NONEXISTENT_PID, gpu=0, mem_mib=1000),
        ProcSpec(pid=1234, gpu=1, mem_mib=8, kind="graphics"),
    ]
    nvml_node.write(sc)
    backend = nvml_node.backend()
    assert [(p.pid, p.kind) for p in backend.processes(0)] == [(NONEXISTENT_PID, "compute")]
    assert backend.memory_used(0) == 1000 * MIB
    assert [(p.pid, p.used_memory, p.kind) for p in backend.processes(1)] == [(1234, 8 * MIB, "graphics")]


def test_cheap_polls_make_minimal_nvml_calls(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    backend.snapshot(0)  # caches the handle
    ctl = fake_ctl(nvml_node)
    start = ctl.fakeNvmlCallCount()
    backend.memory_used(0)
    assert ctl.fakeNvmlCallCount() - start == 1
    start = ctl.fakeNvmlCallCount()
    assert backend.processes(0) == ()
    assert ctl.fakeNvmlCallCount() - start == 2  # compute + graphics, one call each when empty


def test_snapshot_of_eight_gpus_is_fast(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    t0 = time.perf_counter()
    for i in range(backend.device_count()):
        backend.snapshot(i)
    assert time.perf_counter() - t0 < 0.5  # generous: ~5 ms in practice; catches pathological slowness


# ---------------------------------------------------------------------------------------------------------
# XID events
# ---------------------------------------------------------------------------------------------------------


def test_watch_xid_returns_the_event_after_its_window(nvml_node: NvmlNode) -> None:
    nvml_node.write(xid(gpu=3, code=79))
    backend = nvml_node.backend()
    t0 = time.monotonic()
    events = backend.watch_xid(list(range(8)), 0.2)
    elapsed = time.monotonic() - t0
    assert [(e.gpu_index, e.xid) for e in events] == [(3, 79)]
    assert 0.2 <= elapsed < 1.0
    assert backend.watch_xid([3], 0.05) == []  # delivered once


def test_watch_xid_sees_an_event_during_the_window_and_ignores_unwatched_gpus(nvml_node: NvmlNode) -> None:
    sc = xid(gpu=2, code=48, after_ms=60)
    sc.xids.append(sc.xids[0].__class__(gpu=5, xid=79))
    nvml_node.write(sc)
    events = nvml_node.backend().watch_xid([0, 1, 2], 0.15)
    assert [(e.gpu_index, e.xid) for e in events] == [(2, 48)]


def test_watch_xid_stop_ends_it_promptly(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    t0 = time.monotonic()
    assert backend.watch_xid(list(range(8)), 5.0, stop) == []
    assert time.monotonic() - t0 < 1.0


def test_watch_xid_unsupported_waits_out_the_window(nvml_node: NvmlNode) -> None:
    sc = xid(gpu=0, count=2)
    for g in sc.gpus:
        g.unsupported.add("events")
    nvml_node.write(sc)
    t0 = time.monotonic()
    assert nvml_node.backend().watch_xid([0, 1], 0.1) == []
    assert 0.1 <= time.monotonic() - t0 < 1.0


# ---------------------------------------------------------------------------------------------------------
# As a real user: subprocesses, LD_LIBRARY_PATH only
# ---------------------------------------------------------------------------------------------------------

SNAPSHOT_SCRIPT = """
    import json, sys
    from podguard.gpu.backend import NvmlUnavailable
    try:
        from podguard.gpu.nvml import NvmlBackend
        b = NvmlBackend()
    except NvmlUnavailable as exc:
        print(json.dumps({"kind": exc.kind.value, "message": exc.message}))
        sys.exit(0)
    gpus = [b.snapshot(i).to_dict() for i in range(b.device_count())]
    out = {"driver": b.driver().__dict__, "count": b.device_count(), "gpus": gpus}
    b.close()
    print(json.dumps(out))
"""


def test_subprocess_finds_the_fake_through_ld_library_path(nvml_node: NvmlNode) -> None:
    sc = ecc_and_remap(ecc_gpu=1, remap_gpu=2)
    sc.procs.append(ProcSpec(pid=NONEXISTENT_PID, gpu=0, mem_mib=512))
    nvml_node.write(sc)
    env = nvml_node.env
    assert "PODGUARD_NVML_LIBRARY" not in env
    proc = run_python(SNAPSHOT_SCRIPT, env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["count"] == 8 and out["driver"]["cuda_driver_version"] == "12.4"
    gpus = out["gpus"]
    assert gpus[1]["ecc"]["uncorrected_volatile"] == 2
    assert gpus[2]["ecc"]["remap_pending"] is True
    assert gpus[0]["processes"] == [{"pid": NONEXISTENT_PID, "used_memory": 512 * MIB, "kind": "compute", "mig": None}]
    assert gpus[0]["compute_mode"] == "default"


def test_subprocess_init_failure_via_ld_library_path(nvml_node: NvmlNode) -> None:
    nvml_node.write(init_failure("DRIVER_NOT_LOADED"))
    proc = run_python(SNAPSHOT_SCRIPT, nvml_node.env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kind"] == "driver_not_loaded"


def test_no_driver_is_library_not_found(nvml_node: NvmlNode) -> None:
    env = {k: v for k, v in nvml_node.env.items() if k != "LD_LIBRARY_PATH"}
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real NVIDIA driver library is installed on this machine")
    proc = run_python(SNAPSHOT_SCRIPT, env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == "library_not_found"
    assert "CPU-only" in out["message"]
    # An explicit library path that does not exist is the same failure, named.
    proc = run_python(SNAPSHOT_SCRIPT, {**env, "PODGUARD_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"})
    out = json.loads(proc.stdout)
    assert out["kind"] == "library_not_found" and "/nonexistent/" in out["message"]


def test_old_driver_without_newer_symbols(nvml_node: NvmlNode, fake_nvml_old: FakeNvmlBuild) -> None:
    """An old driver library: memory falls back to v1 (reserved n/a), clocks to the throttle symbol, the
    CUDA version to v1, process lists to _v2; MIG and row remapping are n/a. No errors."""
    sc = healthy_h100(2)
    sc.procs.append(ProcSpec(pid=NONEXISTENT_PID, gpu=1, mem_mib=256))
    nvml_node.write(sc)
    env = {**nvml_node.env, "LD_LIBRARY_PATH": str(fake_nvml_old.lib_dir)}
    proc = run_python(SNAPSHOT_SCRIPT, env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["driver"]["cuda_driver_version"] == "12.4"
    g0, g1 = out["gpus"]
    assert g0["errors"] == [] and g0["lost"] is False
    assert g0["memory_reserved"] is None and g0["memory_total"] == 81559 * MIB
    assert g0["memory_used"] == 530 * MIB  # v1 folds the reserved memory into "used"
    assert g0["clock_event_reasons"] == 1
    assert g0["mig_enabled"] is None and g0["ecc"]["remap_pending"] is None
    assert (g0["nvlink_links"], g0["nvlink_active"]) == (18, 18)  # per-link state calls: no link-state field
    assert g1["processes"] == [{"pid": NONEXISTENT_PID, "used_memory": 256 * MIB, "kind": "compute", "mig": None}]


def test_import_is_cheap_and_pulls_no_heavy_modules() -> None:
    code = (
        "import sys, podguard.gpu.nvml; "
        "print(','.join(m for m in ('pynvml', 'torch', 'runpod', 'docker') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert proc.stdout.strip() == ""


def test_custom_gpu_spec_round_trip(nvml_node: NvmlNode) -> None:
    spec = GpuSpec(index=0, name="NVIDIA A100-SXM4-80GB", mem_total_mib=81920, util_gpu=37, persistence=False)
    spec.compute_mode = "PROHIBITED"
    nvml_node.write(healthy_h100(1).copy(gpus=[spec]))
    s = nvml_node.backend().snapshot(0)
    assert (s.name, s.memory_total, s.utilization_gpu) == ("NVIDIA A100-SXM4-80GB", 81920 * MIB, 37)
    assert s.compute_mode is ComputeMode.PROHIBITED and s.persistence_mode is False


def test_env_library_variable_is_honoured(nvml_node: NvmlNode) -> None:
    """The fixture sets PODGUARD_NVML_LIBRARY for this process: a plain NvmlBackend() uses the fake."""
    assert os.environ["PODGUARD_NVML_LIBRARY"] == str(nvml_node.library)
    with NvmlBackend() as backend:
        assert backend.device_count() == 8

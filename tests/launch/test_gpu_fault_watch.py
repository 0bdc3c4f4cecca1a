"""The run-time GPU fault watch (podguard.launch.watch.gpu_faults) on the real nvidia-ml-py binding and the fake NVML.

Why these tests: the watch is what turns "a GPU fell off the bus mid-run" into "GPU 3, Xid 79" and exit 76
(docs/watch.md, "GPU faults"). They pin what is fatal (Xid 79/95, a lost GPU, uncorrected ECC rising, a recovery
action), what is only printed (application Xids), that each fault comes once, that a poll never blocks or raises,
and that a CPU-only node gets no watch. The node changes while the watch polls (`nvml_node.write`), as a GPU would
fail during a run.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakenvml import NvmlNode, Scenario, XidSpec, ecc_and_remap, fields_unsupported, healthy_h100, lost_gpu
from fakenvml.scenario import RECOVERY_GPU_RESET, RECOVERY_NODE_REBOOT
from podguard.gpu.backend import GpuHealth, XidEvent
from podguard.launch.watch.gpu_faults import (
    APPLICATION_XIDS,
    FATAL_XIDS,
    POLL_INTERVAL_S,
    GpuFault,
    GpuFaultWatch,
    open_gpu_fault_watch,
)

REPO = Path(__file__).resolve().parents[2]


def selected(scenario: Scenario, indices: list[int] | None = None) -> list[tuple[int, str | None]]:
    """(index, uuid) of the GPUs the run selected, as the supervisor passes them."""
    gpus = scenario.gpus if indices is None else [scenario.gpus[i] for i in indices]
    return [(g.index, g.uuid) for g in gpus]


@pytest.fixture
def watch_on(nvml_node: NvmlNode) -> Iterator[object]:
    """`watch_on(indices=None)`: a watch on the node's (selected) GPUs, closed at teardown."""
    watches: list[GpuFaultWatch] = []

    def make(indices: list[int] | None = None) -> GpuFaultWatch:
        watch = open_gpu_fault_watch(selected(nvml_node.scenario, indices))
        assert watch is not None
        watches.append(watch)
        return watch

    yield make
    for watch in watches:
        watch.close()


def poll_until(watch: GpuFaultWatch, timeout_s: float = 2.0) -> list[GpuFault]:
    """Poll (as the supervisor's loop would, faster) until something comes, or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        faults = watch.poll()
        if faults:
            return faults
        time.sleep(0.01)
    return []


# ---------------------------------------------------------------------------------------------------------
# Fatal faults
# ---------------------------------------------------------------------------------------------------------


def test_xid_79_and_the_lost_gpu_mid_watch_are_fatal_named_and_reported_once_each(nvml_node, watch_on) -> None:
    watch = watch_on()
    assert watch.poll() == []
    sc = nvml_node.scenario
    sc.xids.append(XidSpec(gpu=3, xid=79))
    sc.gpus[3].lost = True
    nvml_node.write()

    faults = watch.poll()
    uuid = sc.gpus[3].uuid
    assert [(f.index, f.uuid, f.kind, f.xid, f.fatal) for f in faults] == [
        (3, uuid, "xid", 79, True),
        (3, uuid, "lost", 79, True),
    ]
    assert faults[0].text == f"GPU 3 ({uuid}): Xid 79: GPU has fallen off the bus"
    assert faults[1].text.startswith(f"GPU 3 ({uuid}): lost") and "Xid 79" in faults[1].text
    record = faults[1].to_dict()
    assert {k: record[k] for k in ("gpu", "uuid", "xid", "kind", "fatal")} == {
        "gpu": 3,
        "uuid": uuid,
        "xid": 79,
        "kind": "lost",
        "fatal": True,
    }

    for _ in range(20):
        assert watch.poll() == []
    sc.gpus[0].temperature_c = 40  # any rewrite of the scenario: the Xid already came, the GPU is still lost
    nvml_node.write()
    assert watch.poll() == []
    assert [f.kind for f in watch.faults] == ["xid", "lost"]
    assert watch.fatal_on(3) is faults[0] and watch.fatal_on(2) is None


def test_a_gpu_lost_before_its_xid_is_named_lost_then_the_xid_comes_on_its_own(nvml_node, watch_on) -> None:
    watch = watch_on()
    nvml_node.scenario.gpus[5].lost = True
    nvml_node.write()
    [lost] = watch.poll()
    assert (lost.index, lost.kind, lost.xid, lost.fatal) == (5, "lost", None, True)
    nvml_node.scenario.xids.append(XidSpec(gpu=5, xid=79))
    nvml_node.write()
    [xid] = watch.poll()
    assert (xid.index, xid.kind, xid.xid, xid.fatal) == (5, "xid", 79, True)


def test_a_gpu_already_lost_when_the_watch_opens_is_reported_by_the_first_poll(nvml_node, watch_on) -> None:
    nvml_node.write(lost_gpu(gpu=5))
    watch = watch_on()
    [lost] = watch.poll()
    assert (lost.index, lost.kind, lost.fatal) == (5, "lost", True)
    assert watch.poll() == []


def test_xid_95_is_fatal_and_arrives_after_its_delay(nvml_node, watch_on) -> None:
    watch = watch_on()
    nvml_node.scenario.xids.append(XidSpec(gpu=2, xid=95, after_ms=150))
    nvml_node.write()
    t0 = time.monotonic()
    assert watch.poll() == []  # not due yet: the delay counts from when the fake noticed the line
    [fault] = poll_until(watch)
    assert time.monotonic() - t0 >= 0.14
    assert (fault.index, fault.kind, fault.xid, fault.fatal) == (2, "xid", 95, True)
    assert "uncontained ECC error" in fault.text


@pytest.mark.parametrize("code", sorted(FATAL_XIDS))
def test_every_fatal_xid_is_fatal(nvml_node, watch_on, code: int) -> None:
    watch = watch_on([1])
    nvml_node.scenario.xids.append(XidSpec(gpu=1, xid=code))
    nvml_node.write()
    [fault] = watch.poll()
    assert (fault.xid, fault.fatal, fault.application) == (code, True, False)


def test_uncorrected_ecc_rising_is_fatal_once(nvml_node, watch_on) -> None:
    nvml_node.write(ecc_and_remap(ecc_gpu=1))  # GPU 1 starts with 2 uncorrected volatile errors: the baseline
    watch = watch_on()
    for _ in range(5):
        assert watch.poll() == []
    nvml_node.scenario.gpus[1].ecc_uncorrected_volatile = 3
    nvml_node.write()
    [fault] = watch.poll()
    assert (fault.index, fault.kind, fault.xid, fault.fatal) == (1, "ecc_uncorrected", None, True)
    assert "1 new uncorrected ECC error(s) (volatile count 2 -> 3)" in fault.text
    nvml_node.scenario.gpus[1].ecc_uncorrected_volatile = 9
    nvml_node.write()
    assert watch.poll() == []


def test_a_recovery_action_is_fatal_once_per_action(nvml_node, watch_on) -> None:
    watch = watch_on()
    assert watch.poll() == []
    nvml_node.scenario.gpus[0].recovery_action = RECOVERY_GPU_RESET
    nvml_node.write()
    [fault] = watch.poll()
    assert (fault.index, fault.kind, fault.fatal) == (0, "recovery_action", True)
    assert "the driver asks for a GPU reset (recovery action reset)" in fault.text
    assert watch.poll() == []
    nvml_node.scenario.gpus[0].recovery_action = RECOVERY_NODE_REBOOT
    nvml_node.write()
    [reboot] = watch.poll()
    assert "a node reboot" in reboot.text


# ---------------------------------------------------------------------------------------------------------
# Printed, never acted on
# ---------------------------------------------------------------------------------------------------------


def test_xid_31_is_an_application_fault_named_but_not_fatal(nvml_node, watch_on) -> None:
    watch = watch_on()
    nvml_node.scenario.xids.append(XidSpec(gpu=4, xid=31))
    nvml_node.write()
    [fault] = watch.poll()
    uuid = nvml_node.scenario.gpus[4].uuid
    assert (fault.index, fault.uuid, fault.kind, fault.xid) == (4, uuid, "xid", 31)
    assert (fault.fatal, fault.application) == (False, True)
    assert fault.text.startswith(f"GPU 4 ({uuid}): Xid 31: GPU memory page fault (application-level")
    assert watch.fatal_on(4) is None
    assert set(APPLICATION_XIDS) == {13, 31, 43, 45}


def test_another_xid_is_reported_not_fatal(nvml_node, watch_on) -> None:
    watch = watch_on()
    nvml_node.scenario.xids += [XidSpec(gpu=0, xid=8), XidSpec(gpu=1, xid=61)]
    nvml_node.write()
    faults = sorted((f.index, f.xid, f.fatal, f.application) for f in watch.poll())
    assert faults == [(0, 8, False, False), (1, 61, False, False)]


@pytest.mark.parametrize("code", [63, 92])
def test_xid_63_and_92_are_printed_never_acted_on(nvml_node, watch_on, code: int) -> None:
    """NVIDIA's Xid catalogue asks no immediate action for a page retired / a row marked for remapping (63) or a
    high single-bit ECC rate (92): the GPU goes on; the next preflight judges it (a pending remap is the gate's)."""
    watch = watch_on([1])
    nvml_node.scenario.xids.append(XidSpec(gpu=1, xid=code))
    nvml_node.write()
    [fault] = watch.poll()
    assert (fault.xid, fault.fatal, fault.application) == (code, False, False)
    assert code not in FATAL_XIDS


def test_gpus_the_run_did_not_select_are_not_watched(nvml_node, watch_on) -> None:
    watch = watch_on([0, 1])
    sc = nvml_node.scenario
    sc.xids.append(XidSpec(gpu=6, xid=79))
    sc.gpus[6].lost = True
    sc.gpus[7].ecc_uncorrected_volatile = 4
    nvml_node.write()
    for _ in range(5):
        assert watch.poll() == []


# ---------------------------------------------------------------------------------------------------------
# Quiet, cheap, never raising
# ---------------------------------------------------------------------------------------------------------


def fake_calls(node: NvmlNode) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(node.library))
    lib.fakeNvmlCallCount.restype = ctypes.c_ulonglong
    return lib


def test_a_healthy_node_polled_many_times_gives_nothing_in_few_nvml_calls(nvml_node, watch_on) -> None:
    watch = watch_on()
    lib = fake_calls(nvml_node)
    lib.fakeNvmlResetCallCount()
    t0 = time.monotonic()
    for _ in range(200):
        assert watch.poll() == []
    elapsed = time.monotonic() - t0
    # per poll: one 0 ms event wait, then per GPU the recovery-action field and the ECC count
    assert lib.fakeNvmlCallCount() == 200 * (1 + 2 * 8)
    assert elapsed / 200 < 0.1 * POLL_INTERVAL_S  # generous: the bench measures it (bench/bench_gpu_watch.py)
    assert watch.unknown == {} and watch.faults == []
    assert watch.to_dict()["xid_events"] is True


def test_nvml_errors_other_than_lost_are_unknown_never_faults_and_never_raise(nvml_node, watch_on) -> None:
    sc = healthy_h100(4)
    sc.gpus[0].fail = {"ecc_errors": "UNKNOWN"}
    sc.gpus[1].fail = {"field_values": "NO_PERMISSION"}
    sc.gpus[2].fail = {"recovery_action": "INSUFFICIENT_RESOURCES"}
    sc.gpus[3].unsupported = {"events"}
    sc.event_wait_error = "UNKNOWN"
    nvml_node.write(sc)
    watch = watch_on()
    for _ in range(5):
        assert watch.poll() == []
    assert watch.unknown["xid events"] == "error 999"
    assert watch.unknown["GPU 3 xid events"] == "NOT_SUPPORTED"
    assert watch.unknown["GPU 0 ecc"] == "error 999"
    assert watch.unknown["GPU 1 recovery_action"] == "NO_PERMISSION"
    assert watch.unknown["GPU 2 recovery_action"] == "INSUFFICIENT_RESOURCES"
    sc.gpus[1].lost = True  # GPU_IS_LOST is the one error that is a fault
    nvml_node.write()
    [fault] = watch.poll()
    assert (fault.index, fault.kind, fault.fatal) == (1, "lost", True)


def test_a_gpu_without_ecc_recovery_action_or_events_is_still_found_lost(nvml_node, watch_on) -> None:
    nvml_node.write(fields_unsupported(2))  # consumer boards: memory info is the liveness probe
    watch = watch_on()
    assert watch.poll() == []
    assert "xid events" in watch.unknown and "GPU 0 ecc" in watch.unknown
    nvml_node.scenario.gpus[1].lost = True
    nvml_node.write()
    [fault] = watch.poll()
    assert (fault.index, fault.kind) == (1, "lost")


class BrokenBackend:
    """A backend whose every call raises: the watch must still never raise."""

    def open_xid_events(self, indices: list[int]) -> None:
        raise RuntimeError("event API exploded")

    def health(self, index: int) -> GpuHealth:
        raise OSError("ctypes trouble")

    def close(self) -> None:
        raise RuntimeError("close failed")


def test_a_backend_that_raises_makes_the_watch_unknown_not_broken() -> None:
    watch = GpuFaultWatch(BrokenBackend(), [(0, "GPU-a"), (1, None)], owns_backend=True)  # type: ignore[arg-type]
    assert watch.poll() == [] and watch.poll() == []
    assert watch.unknown["xid events"].startswith("RuntimeError")
    assert watch.unknown["GPU 1"].startswith("OSError")
    watch.close()
    watch.close()


class ScriptedBackend:
    """Health and events from a script, to pin the rules without NVML."""

    def __init__(self) -> None:
        self.health_of: dict[int, GpuHealth] = {}
        self.pending: list[XidEvent] = []
        self.indices: tuple[int, ...] = ()
        self.unwatched: dict[int, str] = {}
        self.failure: str | None = None

    def open_xid_events(self, indices: list[int]) -> ScriptedBackend:
        self.indices = tuple(indices)
        return self

    def poll(self) -> list[XidEvent]:
        out, self.pending = self.pending, []
        return out

    def health(self, index: int) -> GpuHealth:
        return self.health_of.get(index, GpuHealth(index, ecc_uncorrected_volatile=0, recovery_action="none"))

    def close(self) -> None:
        pass


def test_a_lost_gpu_is_named_with_its_fatal_xid_before_a_later_application_one() -> None:
    backend = ScriptedBackend()
    watch = GpuFaultWatch(backend, [(2, None), (2, "GPU-2")])  # type: ignore[arg-type]  # two MIG slices: one GPU
    assert watch.gpus == {2: "GPU-2"}
    backend.pending = [XidEvent(2, 79, 0.0), XidEvent(2, 13, 0.0)]
    backend.health_of[2] = GpuHealth(2, lost=True)
    faults = watch.poll()
    assert [(f.kind, f.xid, f.fatal) for f in faults] == [("xid", 79, True), ("xid", 13, False), ("lost", 79, True)]
    assert faults[0].text == "GPU 2 (GPU-2): Xid 79: GPU has fallen off the bus"


def test_ecc_unknown_at_open_takes_the_first_count_read_as_its_base() -> None:
    backend = ScriptedBackend()
    backend.health_of[0] = GpuHealth(0, unknown=("ecc: NO_PERMISSION",))
    watch = GpuFaultWatch(backend, [(0, None)])  # type: ignore[arg-type]
    backend.health_of[0] = GpuHealth(0, ecc_uncorrected_volatile=5)
    assert watch.poll() == []
    backend.health_of[0] = GpuHealth(0, ecc_uncorrected_volatile=6)
    [fault] = watch.poll()
    assert fault.kind == "ecc_uncorrected" and "5 -> 6" in fault.text


def test_a_recovery_action_already_asked_for_at_open_is_not_a_new_fault() -> None:
    backend = ScriptedBackend()
    backend.health_of[0] = GpuHealth(0, recovery_action="reset")
    watch = GpuFaultWatch(backend, [(0, None)])  # type: ignore[arg-type]
    assert watch.poll() == []
    backend.health_of[0] = GpuHealth(0, recovery_action="reboot")
    [fault] = watch.poll()
    assert fault.kind == "recovery_action" and fault.fatal


# ---------------------------------------------------------------------------------------------------------
# No watch: CPU-only node, nothing selected
# ---------------------------------------------------------------------------------------------------------


def test_no_nvml_library_gives_no_watch_and_no_exception(tmp_path: Path) -> None:
    assert open_gpu_fault_watch([(0, None)], library_path=tmp_path / "libnvidia-ml.so.1") is None
    assert open_gpu_fault_watch([]) is None


def test_a_cpu_only_node_gives_no_watch(tmp_path: Path) -> None:
    """A real CPU-only process: no libnvidia-ml.so.1 anywhere on its library path."""
    code = textwrap.dedent(
        """
        from podguard.launch.watch.gpu_faults import open_gpu_fault_watch
        print(open_gpu_fault_watch([(0, None), (1, None)]))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "entrypoint"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


def test_the_poll_interval_is_a_second() -> None:
    """Seconds, not minutes: a lost GPU hangs the other ranks, and the job must end within seconds."""
    assert GpuFaultWatch.POLL_INTERVAL_S == POLL_INTERVAL_S == 1.0


# ---------------------------------------------------------------------------------------------------------
# The fake's event semantics the watch relies on
# ---------------------------------------------------------------------------------------------------------


def test_fake_xid_kept_by_a_rewrite_is_not_delivered_again_and_a_new_one_is(nvml_node: NvmlNode) -> None:
    backend = nvml_node.backend()
    events = backend.open_xid_events([0, 1])
    assert events is not None
    try:
        nvml_node.scenario.xids.append(XidSpec(gpu=0, xid=48))
        nvml_node.write()
        assert [(e.gpu_index, e.xid) for e in events.poll()] == [(0, 48)]
        nvml_node.write()  # the same line again: the same event
        assert events.poll() == []
        nvml_node.scenario.xids.append(XidSpec(gpu=1, xid=48))
        nvml_node.write()
        assert [(e.gpu_index, e.xid) for e in events.poll()] == [(1, 48)]
    finally:
        events.close()


# --- NVML off the supervisor's loop (issue 23, item 10) ----------------------------------------------------

STEPPER = """
import os, pathlib, sys, time
pathlib.Path(os.environ["READY"] + os.environ["RANK"]).touch()
for i in range(15):
    print(f"rank {os.environ['RANK']} step {i}", flush=True)
    time.sleep(0.2)
time.sleep(3600)  # then it hangs: the hang watch must still find it while NVML does not answer
"""


def test_an_nvml_call_that_never_returns_is_a_finding_not_a_frozen_supervisor(nvml_node, tmp_path, monkeypatch):
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PODGUARD_PROBE", "off")
    for var in ("GPU_LIST", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "RUNPOD_GPU_COUNT", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    job = tmp_path / "stepper.py"
    job.write_text(STEPPER)
    scenario = nvml_node.write(healthy_h100(2))
    ready = tmp_path / "ready"
    env = {**nvml_node.env, "READY": str(ready), "PODGUARD_NVML_STALL_S": "1"}
    args = ["train", "--mode", "per-gpu", "--hang-timeout", "2", "--grace", "1", "--", sys.executable, str(job)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "podguard", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and proc.poll() is None, "the workers did not start"
            time.sleep(0.05)
        scenario.event_wait_hang = True  # every nvmlEventSetWait from now on blocks
        nvml_node.write(scenario)
        stuck_at = time.monotonic()
        out, _ = proc.communicate(timeout=40)  # the old loop froze inside NVML: this timed out
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 79, out[-3000:]  # the hang watch still ran while NVML was stuck
    assert time.monotonic() - stuck_at < 20
    assert "podguard: GPU watch: NVML has not answered for " in out, out[-3000:]
    assert "rank 1 step 14" in out  # the workers' lines kept flowing through the loop
    (run,) = sorted((tmp_path / "state" / "runs").iterdir())
    assert "NVML has not answered" in (run / "watch.json").read_text()


def test_a_fatal_xid_ends_the_job_when_the_poll_sees_it_not_at_the_loops_next_tick(nvml_node, tmp_path):
    """The poller's thread wakes the loop as soon as a poll finds a fault: with the loop's tick at 30 s, an Xid 79
    still ends the job in about a second (it waited for the next tick: up to a tick more than before the thread)."""
    import threading

    from podguard.launch.run import run_job
    from podguard.launch.spec import WorkerSpec
    from podguard.launch.watch.runtime import RuntimeSettings, RuntimeWatch

    scenario = nvml_node.write(healthy_h100(2))
    gpus = open_gpu_fault_watch(selected(scenario, [0]))
    assert gpus is not None
    watch = RuntimeWatch(RuntimeSettings(gpus=tuple(selected(scenario, [0])), tick_s=30.0), tmp_path, gpu_watch=gpus)
    worker = WorkerSpec("GPU0", (sys.executable, "-c", "import time; time.sleep(60)"), gpus=(0,))
    faulted: list[float] = []

    def fault() -> None:
        time.sleep(1.0)
        scenario.xids.append(XidSpec(gpu=0, xid=79, after_ms=0))
        nvml_node.write(scenario)
        faulted.append(time.monotonic())

    threading.Thread(target=fault, daemon=True).start()
    with open("/dev/null", "wb") as devnull:
        try:
            outcome = run_job([worker], grace_s=1, watch=watch, terminal=devnull, summary=False)
        finally:
            watch.close()
    assert outcome.exit_code == 76, outcome
    assert time.monotonic() - faulted[0] < 6.0  # one poll (1 s), SIGTERM, the end; was the 30 s tick

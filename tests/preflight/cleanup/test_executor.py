"""Executing a cleanup against real processes with real signals, and waiting for GPU memory.

NVML is the in-Python FakeBackend (a dead PID stops counting, like the driver); holders are real
processes with stand-in device files open. Every test's processes are killed by the `spawner`
finalizer, whatever happens.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

import podguard.preflight.cleanup.idle as idle_mod
import podguard.preflight.cleanup.pidfd as pidfd_mod
import podguard.preflight.cleanup.stopround as stopround_mod
from fakes import FakeBackend
from podguard import console
from podguard.gpu.backend import GpuProcess
from podguard.preflight.cleanup.executor import (
    CleanupResult,
    GpuState,
    cleanup,
    execute_cleanup,
    plan_cleanup,
    wait_for_idle,
)
from podguard.preflight.cleanup.process_table import ProcStat, scan_processes
from procspawn import PY, Spawner, alive, wait_until

GIB = 1 << 30


class DriverLikeBackend(FakeBackend):
    """A FakeBackend whose process lists follow the device files, like the driver's contexts do: any
    local process with `<dev>/nvidia<N>` open is on GPU N with 1 GiB, and a dead one's context lingers
    for `release_s` (the driver's release time), so a respawned worker shows up as it would."""

    dev: Path = Path("/nonexistent")
    release_s: float = 0.1

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        seen: dict[int, float | None] = self.__dict__.setdefault(f"_seen{index}", {})
        now = time.monotonic()
        holding = set(scan_processes(self.dev).holders_of_minor(index))
        out = []
        for pid in holding:
            seen[pid] = None
        for pid, died in list(seen.items()):
            if pid not in holding and died is None:
                seen[pid] = died = now
            if died is None or now - died < self.release_s:
                out.append(GpuProcess(pid, GIB, "compute"))
        return tuple(out)

    def memory_used(self, index: int) -> int | None:
        return sum(p.used_memory or 0 for p in self.processes(index))


class HostPidBackend(FakeBackend):
    """NVML as seen from a container: it also reports PIDs of another PID namespace (never alive here)."""

    host: tuple[GpuProcess, ...] = ()

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        return super().processes(index) + (self.host if index == 0 else ())

    def memory_used(self, index: int) -> int | None:
        base = super().memory_used(index) or 0
        return base + (sum(p.used_memory or 0 for p in self.host) if index == 0 else 0)


def nvml(backend: FakeBackend, gpu: int, *pids: int, mem: int = 2 * GIB) -> None:
    backend.set(gpu, processes=tuple(GpuProcess(pid, mem, "compute") for pid in pids))


def run(backend: FakeBackend, spawner: Spawner, gpus: tuple[int, ...] = (0,), **kw: object) -> CleanupResult:
    plan_keys = {"protect", "patterns", "self_pid", "uid"}
    plan_kw = {k: v for k, v in kw.items() if k in plan_keys}
    exec_kw = {k: v for k, v in kw.items() if k not in plan_keys}
    exec_kw.setdefault("grace_s", 2.0)
    exec_kw.setdefault("busy_timeout_s", 2.0)
    exec_kw.setdefault("kill_timeout_s", 2.0)
    plan = plan_cleanup(backend, gpus, dev_dir=spawner.dev, **plan_kw)  # type: ignore[arg-type]
    return execute_cleanup(plan, backend, **exec_kw)  # type: ignore[arg-type]


def test_launcher_is_stopped_first_and_the_worker_does_not_come_back(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(2)
    launcher, worker, log = spawner.launcher("nvidia0", "nvidiactl", "nvidia-uvm")
    nvml(backend, 0, worker, mem=20 * GIB)
    res = run(backend, spawner)
    assert [a.pid for a in res.actions] == [launcher, worker]
    assert res.actions[0].role == "launcher" and res.actions[0].signals == ("SIGTERM",)
    assert all(a.outcome == "terminated" for a in res.actions)
    assert not alive(launcher) and not alive(worker)
    assert res.ok and res.states[0].state is GpuState.IDLE
    time.sleep(0.1)  # had the worker been killed first, the agent would have respawned it by now
    assert spawner.worker_pids(log) == [worker]
    assert scan_processes(spawner.dev).holders_of_minor(0) == ()


def test_launcher_that_ignores_sigterm_and_respawns_is_killed_with_its_new_worker(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    launcher, worker, log = spawner.launcher("nvidia0", ignore_term=True)
    nvml(backend, 0, worker)
    res = run(backend, spawner, grace_s=0.25)
    by_pid = {a.pid: a for a in res.actions}
    assert by_pid[launcher].outcome == "killed" and by_pid[launcher].signals == ("SIGTERM", "SIGKILL")
    assert by_pid[worker].outcome == "terminated"
    respawned = [pid for pid in spawner.worker_pids(log) if pid != worker]
    assert respawned, "the launcher should have respawned its worker during the grace period"
    for pid in respawned:  # adopted while the tree was frozen, then killed
        assert pid in by_pid and not alive(pid)
    assert scan_processes(spawner.dev).holders_of_minor(0) == ()
    assert res.ok


def test_holder_that_ignores_sigterm_gets_sigkill_right_after_the_grace(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0", ignore_term=True)
    nvml(backend, 0, pid)
    t0 = time.monotonic()
    res = run(backend, spawner, grace_s=0.2)
    elapsed = time.monotonic() - t0
    (a,) = res.actions
    assert a.outcome == "killed" and a.signals == ("SIGTERM", "SIGKILL")
    assert a.exit_ms is not None and 200 <= a.exit_ms < 200 + 250  # SIGKILL right at the deadline
    assert 0.2 <= elapsed < 0.2 + 1.5, elapsed  # the grace is honoured, not exceeded by much
    assert not alive(pid) and res.ok


def test_forked_child_holding_the_device_is_stopped_with_its_parent(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    parent, kids = spawner.holder("nvidia0", "nvidiactl", fork=3)
    nvml(backend, 0, parent)  # NVML lists only the parent
    res = run(backend, spawner)
    assert {a.pid for a in res.killed} == {parent, *kids}
    assert res.actions[0].pid == parent
    assert not any(alive(p) for p in (parent, *kids))


def test_unrelated_local_process_with_nvmls_pid_survives(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    bystander = spawner.plain(["sleep", "30"])
    nvml(backend, 0, bystander, mem=4 * GIB)
    res = run(backend, spawner, busy_timeout_s=0.1)
    assert res.actions == () and alive(bystander)
    assert [f.pid for f in res.foreign] == [bystander]
    state = res.states[0]
    assert state.state is GpuState.PHANTOM and "another PID namespace" in state.detail


def test_pid_from_another_namespace_is_foreign_and_nothing_happens(spawner: Spawner) -> None:
    backend = HostPidBackend.healthy(1)
    backend.host = (GpuProcess(4_000_321, 6 * GIB, "compute"),)
    res = run(backend, spawner, busy_timeout_s=0.1)
    assert res.actions == () and res.plan.targets == ()
    assert [(f.pid, f.reason) for f in res.foreign] == [(4_000_321, "not in this PID namespace")]
    assert res.phantom == {0: 6 * GIB}
    assert any("pod heal" in r for r in res.recommendations)


def test_protected_processes_and_monitors_survive_and_are_reported(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    (sshd, _), (lab, _), (monitor, _), (worker, _) = spawner.holders(
        {"devices": ("nvidia0", "nvidiactl"), "comm": "sshd"},
        {"devices": ("nvidia0",), "argv0": "jupyter-lab"},
        {"devices": ("nvidiactl",)},
        {"devices": ("nvidia0",)},
    )
    nvml(backend, 0, sshd, lab, worker)
    res = run(backend, spawner, busy_timeout_s=0.1)
    assert [a.pid for a in res.killed] == [worker]
    assert alive(sshd) and alive(lab) and alive(monitor) and not alive(worker)
    codes = {s.pid: s.code for s in res.skipped}
    assert codes[sshd] == codes[lab] == "protected" and monitor not in codes
    state = res.states[0]
    assert state.state is GpuState.BUSY and set(state.holders) == {sshd, lab}
    assert any("protected" in r for r in res.recommendations)


def test_podguards_ancestors_are_never_touched(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    parent, (child,) = spawner.holder("nvidia0", fork=1)
    nvml(backend, 0, parent)
    res = run(backend, spawner, self_pid=child, busy_timeout_s=0.1)
    assert res.actions == () and alive(parent) and alive(child)
    assert {s.pid: s.code for s in res.skipped} == {parent: "ancestor"}
    assert res.states[0].state is GpuState.BUSY


def test_pattern_match_outside_any_holder_tree_survives(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    token = f"sglang-{uuid.uuid4().hex[:8]}"  # unique: other test runs may share this machine
    bystander = spawner.plain([PY, "-S", "-c", "import time; time.sleep(30)", f"{token}-router"])
    worker, _ = spawner.holder("nvidia0")
    nvml(backend, 0, worker)
    res = run(backend, spawner, patterns=(token,))
    assert [a.pid for a in res.killed] == [worker] and alive(bystander)
    assert {s.pid: s.code for s in res.skipped} == {bystander: "pattern_outside_tree"}


def test_phantom_memory_is_reported_and_the_deadline_respected(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(2)
    backend.set(1, memory_used=5 * GIB)  # memory held, no process anywhere
    t0 = time.monotonic()
    res = run(backend, spawner, gpus=(0, 1), busy_timeout_s=0.2)
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 0.2 + 1.5, elapsed
    assert res.states[0].state is GpuState.IDLE
    assert res.states[1].state is GpuState.PHANTOM and res.phantom == {1: 5 * GIB}
    assert "no process listed" in res.states[1].detail
    assert any(r.startswith("GPU1:") and "pod heal" in r for r in res.recommendations)
    assert not res.ok and res.busy == (1,)


def test_dry_run_kills_nothing_and_reports_the_full_plan(spawner: Spawner, caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend.healthy(1)
    launcher, worker, _ = spawner.launcher("nvidia0")
    nvml(backend, 0, worker)
    caplog.set_level(logging.INFO, logger="podguard.cleanup")
    t0 = time.monotonic()
    res = run(backend, spawner, dry_run=True, busy_timeout_s=5.0)
    assert time.monotonic() - t0 < 1.0  # no waiting in a dry run
    assert res.dry_run and res.actions == () and alive(launcher) and alive(worker)
    assert [(t.pid, t.role) for t in res.planned] == [(launcher, "launcher"), (worker, "holder")]
    assert res.states[0].state is GpuState.BUSY
    assert "would SIGTERM" in caplog.text and str(worker) in caplog.text
    data = json.loads(json.dumps(res.to_dict()))
    assert [t["pid"] for t in data["planned"]] == [launcher, worker] and data["killed"] == []


def test_every_kill_is_logged_and_reported(spawner: Spawner, caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend.healthy(1)
    worker, _ = spawner.holder("nvidia0", "nvidiactl")
    nvml(backend, 0, worker, mem=3 * GIB)
    caplog.set_level(logging.INFO, logger="podguard.cleanup")
    res = run(backend, spawner)
    (rec,) = [r for r in caplog.records if r.name == "podguard.cleanup" and "SIGTERM" in r.getMessage()]
    text = rec.getMessage()
    assert str(worker) in text and "GPU0" in text and "3.0 GiB" in text and "-S -c" in text and "holds GPU0" in text
    data = json.loads(json.dumps(res.to_dict()))
    (killed,) = data["killed"]
    assert killed["pid"] == worker and killed["gpus"] == [0] and killed["memory_mib"] == {"0": 3072.0}
    assert killed["cmdline"].startswith(PY) and killed["reason"]
    assert set(data["timings_ms"]) >= {"scan", "plan", "stop", "wait_idle", "total"}


def test_a_reused_pid_is_never_signalled(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0")
    nvml(backend, 0, pid)
    plan = plan_cleanup(backend, (0,), dev_dir=spawner.dev)
    tree = plan.trees[0]
    stale = replace(tree, targets=tuple(replace(t, start_time=t.start_time - 1) for t in tree.targets))
    res = execute_cleanup(replace(plan, trees=(stale,)), backend, grace_s=1, busy_timeout_s=0.1, max_rounds=1)
    assert [a.outcome for a in res.actions] == ["gone"] and alive(pid)


def test_time_from_holder_death_to_idle_is_well_under_half_a_second(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0")
    nvml(backend, 0, pid, mem=30 * GIB)
    died: list[float] = []

    def kill_later() -> None:
        time.sleep(0.15)
        os.kill(pid, 9)
        wait_until(lambda: not alive(pid), what="holder to die")
        died.append(time.monotonic())

    thread = threading.Thread(target=kill_later)
    thread.start()
    states = wait_for_idle(backend, [0], deadline=time.monotonic() + 5.0, dev_dir=spawner.dev)
    returned = time.monotonic()
    thread.join()
    assert states[0].state is GpuState.IDLE
    assert returned - died[0] < 0.5, returned - died[0]  # polls back off to at most 100 ms


def test_execute_reports_release_latency(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0")
    nvml(backend, 0, pid, mem=30 * GIB)
    res = run(backend, spawner)
    assert res.ok and res.timings_ms["release_after_last_exit"] < 300


def test_a_shell_loop_seen_respawning_its_worker_is_stopped_as_the_next_root(spawner: Spawner) -> None:
    """Issue 7 item 1: an observed respawn is proof; the loop becomes the root of the next round."""
    backend = DriverLikeBackend.healthy(1)
    backend.dev = spawner.dev
    worker = shlex.join(spawner.holder_argv("nvidia0"))
    sh = spawner.shell(f"while true; do {worker} >/dev/null; done")
    wait_until(lambda: len(scan_processes(spawner.dev).holders_of_minor(0)) == 1, what="first worker")
    res = run(backend, spawner, busy_timeout_s=5.0)
    assert not alive(sh) and res.ok and res.rounds == 2
    assert [(r.pid, r.stopped) for r in res.respawners] == [(sh, True)]
    assert [a.role for a in res.actions if a.pid == sh] == ["respawner"]
    assert scan_processes(spawner.dev).holders_of_minor(0) == ()


def test_a_respawner_that_may_not_be_stopped_is_bounded_reported_and_named(spawner: Spawner) -> None:
    backend = DriverLikeBackend.healthy(1)
    backend.dev = spawner.dev
    worker = shlex.join(spawner.holder_argv("nvidia0"))
    sh = spawner.shell(f"while true; do {worker} >/dev/null; done")
    wait_until(lambda: len(scan_processes(spawner.dev).holders_of_minor(0)) == 1, what="first worker")
    res = run(backend, spawner, busy_timeout_s=0.8, max_rounds=2, protect=("bash",))
    assert alive(sh) and not res.ok and res.rounds == 2
    assert any(s.code == "respawn_limit" for s in res.skipped)
    (r,) = res.respawners
    assert r.pid == sh and not r.stopped and "protected" in r.reason
    assert res.states[0].state is GpuState.BUSY
    assert any(rec.startswith(f"pid {sh} ") and "keeps starting holders" in rec for rec in res.recommendations)


def test_a_pattern_naming_the_wrapper_script_stops_the_respawn_loop(spawner: Spawner) -> None:
    backend = DriverLikeBackend.healthy(1)
    backend.dev = spawner.dev
    worker = shlex.join(spawner.holder_argv("nvidia0"))
    token = f"train-forever-{uuid.uuid4().hex[:8]}"
    sh = spawner.shell(f": {token}; while true; do {worker} >/dev/null; done")
    wait_until(lambda: len(scan_processes(spawner.dev).holders_of_minor(0)) == 1, what="first worker")
    res = run(backend, spawner, patterns=(token,))
    assert res.actions[0].pid == sh and not alive(sh)
    assert res.ok and res.rounds == 1
    assert scan_processes(spawner.dev).holders_of_minor(0) == ()


def test_cleanup_convenience_and_progress(spawner: Spawner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle_mod, "PROGRESS_EVERY_S", 0.1)
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0", ignore_term=True)
    nvml(backend, 0, pid)
    with console.captured() as notes:
        res = cleanup(backend, [0], dev_dir=spawner.dev, grace_s=0.25, busy_timeout_s=2)
    assert res.ok and not alive(pid)
    assert any("stopping 1 process" in n for n in notes)
    assert any("waiting for 1 process(es) to exit after SIGTERM" in n for n in notes)


def test_survivor_of_sigkill_is_reported_unkillable(spawner: Spawner, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process stuck in the driver (D state) cannot be made here; simulate the kernel not delivering
    SIGKILL and /proc reporting "D", and check the bounded wait and the report."""
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0", ignore_term=True)
    nvml(backend, 0, pid, mem=8 * GIB)
    real_send, real_stat = pidfd_mod.PinnedProcess.send, pidfd_mod.read_stat

    def swallow_sigkill(self: pidfd_mod.PinnedProcess, sig: signal.Signals, *, record: bool = True) -> bool:
        if sig == signal.SIGKILL and self.pid == pid:
            self.signals.append(sig.name)
            return True
        return real_send(self, sig, record=record)

    def stuck_stat(p: int) -> ProcStat | None:
        st = real_stat(p)
        return replace(st, state="D") if st is not None and p == pid else st

    monkeypatch.setattr(pidfd_mod.PinnedProcess, "send", swallow_sigkill)
    monkeypatch.setattr(pidfd_mod, "read_stat", stuck_stat)
    monkeypatch.setattr(stopround_mod, "read_stat", stuck_stat)
    t0 = time.monotonic()
    res = run(backend, spawner, grace_s=0.1, kill_timeout_s=0.2, busy_timeout_s=0.1)
    assert time.monotonic() - t0 < 0.1 + 0.2 + 1.5
    (a,) = res.unkillable
    assert a.pid == pid and a.state == "D" and a.signals == ("SIGTERM", "SIGKILL")
    assert res.states[0].state is GpuState.BUSY and res.states[0].holders == (pid,)
    assert any("uninterruptible sleep (D state)" in r and "pod heal" in r for r in res.recommendations)
    assert "uninterruptible" in json.dumps(res.to_dict()["unkillable"])


def test_a_gpu_nvml_cannot_query_is_reported_unknown(spawner: Spawner) -> None:
    class LostGpuBackend(FakeBackend):
        def processes(self, index: int) -> tuple[GpuProcess, ...]:
            if index == 1:
                raise RuntimeError("GPU is lost")
            return super().processes(index)

    backend = LostGpuBackend.healthy(2)
    res = run(backend, spawner, gpus=(0, 1), busy_timeout_s=0.05)
    assert res.states[0].state is GpuState.IDLE
    assert res.states[1].state is GpuState.UNKNOWN and "GPU is lost" in res.states[1].detail
    assert any(r.startswith("GPU1:") and "podguard doctor" in r for r in res.recommendations)


def test_in_a_container_that_sees_host_pids_the_local_cuda_leftover_is_stopped(spawner: Spawner) -> None:
    backend = HostPidBackend.healthy(1)
    backend.host = (GpuProcess(4_000_777, 6 * GIB, "compute"),)  # NVML names the leftover by its host PID
    leftover, _ = spawner.holder("nvidia0", "nvidiactl", "nvidia-uvm")
    reader, _ = spawner.holder("nvidia0", "nvidiactl")  # only initialised NVML (a metrics thread)
    res = run(backend, spawner, busy_timeout_s=0.3)
    assert [a.pid for a in res.killed] == [leftover] and not alive(leftover)
    assert alive(reader) and {s.pid: s.code for s in res.skipped} == {reader: "fd_only"}

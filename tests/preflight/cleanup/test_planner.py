"""Who holds the GPUs and what a cleanup may stop: NVML (FakeBackend) cross-checked with real processes.

Planning only: nothing here sends a signal. Real stand-in processes hold plain files in a temp dev dir;
a few rule corner cases (uninspectable fds, a container's PID-1 shell) use a synthetic process table.
"""

from __future__ import annotations

import os
import shlex
import uuid
from pathlib import Path

import pytest

from fakes import FakeBackend
from podguard.errors import UsageError
from podguard.gpu.backend import GpuProcess
from podguard.preflight.cleanup.describe import describe_holders
from podguard.preflight.cleanup.planner import build_plan, plan_cleanup
from podguard.preflight.cleanup.process_table import scan_processes
from podguard.preflight.cleanup.vocabulary import CleanupPlan, Evidence, PlanConfig
from procspawn import PY, Spawner, alive, synthetic, synthetic_table, wait_until

GIB = 1 << 30


def nvml(backend: FakeBackend, gpu: int, *pids: int, mem: int = 2 * GIB) -> None:
    backend.set(gpu, processes=tuple(GpuProcess(pid, mem, "compute") for pid in pids))


def plan(backend: FakeBackend, spawner: Spawner, gpus: tuple[int, ...] = (0,), **kw: object) -> CleanupPlan:
    return plan_cleanup(backend, gpus, dev_dir=spawner.dev, **kw)  # type: ignore[arg-type]


def target_pids(p: CleanupPlan) -> list[int]:
    return [t.pid for t in p.targets]


def skipped(p: CleanupPlan) -> dict[int, str]:
    return {s.pid: s.code for s in p.skipped}


def test_nvml_and_fd_evidence_agree(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(4)
    pid, _ = spawner.holder("nvidia0", "nvidiactl", "nvidia-uvm")
    nvml(backend, 0, pid, mem=10 * GIB)
    p = plan(backend, spawner)
    (h,) = p.holders
    assert (h.pid, h.gpus, h.evidence, h.memory) == (pid, (0,), Evidence.BOTH, {0: 10 * GIB})
    (t,) = p.targets
    assert t.role == "holder" and "GPU0" in t.reason and "10.0 GiB" in t.reason
    assert p.foreign == () and p.skipped == ()


def test_forked_children_are_holders_even_if_nvml_lists_only_the_parent(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(2)
    parent, kids = spawner.holder("nvidia0", "nvidiactl", fork=2)
    nvml(backend, 0, parent)
    p = plan(backend, spawner)
    ev = {h.pid: h.evidence for h in p.holders}
    assert ev == {parent: Evidence.BOTH, kids[0]: Evidence.FD, kids[1]: Evidence.FD}
    assert len(p.trees) == 1 and p.trees[0].root == parent
    assert target_pids(p)[0] == parent and set(target_pids(p)) == {parent, *kids}


def test_nvml_pid_that_is_an_unrelated_local_process_is_foreign(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    bystander = spawner.plain(["sleep", "30"])
    nvml(backend, 0, bystander)
    p = plan(backend, spawner)
    assert p.targets == () and p.holders == ()
    (f,) = p.foreign
    assert f.pid == bystander and f.gpu == 0 and "holds no NVIDIA GPU device file" in f.reason
    assert f.local_cmdline == "sleep 30"


def test_nvml_pid_of_a_local_holder_of_another_gpu_is_foreign_for_this_gpu(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(2)
    pid, _ = spawner.holder("nvidia1")
    nvml(backend, 0, pid)  # NVML says GPU0, but locally this pid only has nvidia1 open
    p = plan(backend, spawner, gpus=(0, 1))
    assert [(f.pid, f.gpu) for f in p.foreign] == [(pid, 0)]
    # its nvidia1 alone does not make it a holder of GPU1: NVML lists nothing of its job there
    assert p.holders == () and skipped(p) == {pid: "fd_only"}


def test_nvml_pid_that_does_not_exist_here_is_foreign(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    table = synthetic_table([synthetic(1, 0, ["init"])], str(spawner.dev))
    host_pid = 4_000_123
    nvml_lists = {0: (GpuProcess(host_pid, 3 * GIB, "compute"),)}
    config = PlanConfig(gpus=(0,), dev_dir=str(spawner.dev), self_pid=os.getpid(), minors={0: 0})
    p = build_plan(table, nvml_lists, config)
    assert p.targets == ()
    (f,) = p.foreign
    assert (f.pid, f.used_memory, f.reason) == (host_pid, 3 * GIB, "not in this PID namespace")
    del backend


def test_protected_processes_are_reported_not_targeted(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    (sshd, _), (lab, _), (mine, _), (worker, _) = spawner.holders(
        {"devices": ("nvidia0",), "comm": "sshd"},  # prctl(PR_SET_NAME)
        {"devices": ("nvidia0",), "argv0": "jupyter-lab"},  # argv[0]
        {"devices": ("nvidia0",), "argv0": "my-notebook-server"},
        {"devices": ("nvidia0",)},
    )
    nvml(backend, 0, sshd, lab, mine, worker)
    p = plan(backend, spawner, protect=("my-notebook*",))
    assert target_pids(p) == [worker]
    codes = skipped(p)
    assert codes[sshd] == codes[lab] == codes[mine] == "protected"
    reasons = {s.pid: s.reason for s in p.skipped}
    assert "'sshd'" in reasons[sshd] and "'jupyter-*'" in reasons[lab] and "'my-notebook*'" in reasons[mine]


def test_monitor_holding_only_nvidiactl_is_not_a_holder(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    mon, _ = spawner.holder("nvidiactl", "nvidia-uvm")
    p = plan(backend, spawner)
    assert p.holders == () and p.targets == () and mon in p.monitors


def test_podguard_itself_and_its_ancestors_are_never_targets(spawner: Spawner, tmp_path: Path) -> None:
    backend = FakeBackend.healthy(1)
    # A holder whose forked child plays "podguard": the holder is then podguard's parent.
    parent, (child,) = spawner.holder("nvidia0", fork=1)
    nvml(backend, 0, parent)
    p = plan(backend, spawner, self_pid=child)
    assert p.targets == ()
    assert skipped(p) == {parent: "ancestor"}
    assert child not in {h.pid for h in p.holders}  # podguard's own NVML handles are not a holder
    # And the real ancestors of this test process (pytest, its shell, PID 1) never appear as targets.
    p2 = plan(backend, spawner)
    mine = {os.getpid(), *scan_processes(fds=False).ancestors(os.getpid())}
    assert not mine.intersection(target_pids(p2))
    assert set(target_pids(p2)) == {parent, child}


def test_holders_of_unselected_gpus_are_left_alone(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(4)
    other, _ = spawner.holder("nvidia2")
    nvml(backend, 2, other)
    p = plan(backend, spawner, gpus=(0, 1))
    assert p.targets == () and skipped(p) == {other: "unselected_gpu"}
    p_all = plan(backend, spawner, gpus=(0, 1), all_gpus=True)
    assert target_pids(p_all) == [other]


def test_minor_numbers_map_device_files_to_nvml_indices(spawner: Spawner) -> None:
    """Inside a container that got GPU 3 only, NVML index 0 is /dev/nvidia3."""
    backend = FakeBackend.healthy(1)
    backend.set(0, minor_number=3)
    pid, _ = spawner.holder("nvidia3")
    nvml(backend, 0, pid)
    p = plan(backend, spawner)
    (h,) = p.holders
    assert h.gpus == (0,) and target_pids(p) == [pid]
    stray, _ = spawner.holder("nvidia1")  # a device NVML does not know: reported, not touched
    p2 = plan(backend, spawner)
    assert skipped(p2).get(stray) == "unmapped_device" and stray not in target_pids(p2)


def test_launcher_is_the_root_and_comes_first(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    launcher, worker, _ = spawner.launcher("nvidia0", "nvidiactl")
    nvml(backend, 0, worker)
    p = plan(backend, spawner)
    (tree,) = p.trees
    assert tree.root == launcher and tree.holders == (worker,)
    assert [(t.pid, t.role) for t in tree.targets] == [(launcher, "launcher"), (worker, "holder")]
    assert "matches launcher 'torchrun'" in tree.targets[0].reason


def test_patterns_widen_to_a_holders_launcher_only(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    name = f"orchestrator-{uuid.uuid4().hex[:8]}"  # unique: other test runs may share this machine
    launcher, worker, _ = spawner.launcher("nvidia0", argv0=name)
    bystander = spawner.plain([PY, "-S", "-c", "import time; time.sleep(30)", f"{name}-sidecar"])
    nvml(backend, 0, worker)
    p = plan(backend, spawner)
    assert target_pids(p) == [worker]  # a plain parent in pytest's process group is not climbed into
    p2 = plan(backend, spawner, patterns=(name,))
    assert target_pids(p2) == [launcher, worker]
    assert skipped(p2) == {bystander: "pattern_outside_tree"}
    assert alive(bystander)


def test_process_group_leader_is_climbed_but_never_a_shell(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    # A non-shell process-group leader (setsid) that starts the worker: same job.
    launcher, worker, _ = spawner.launcher("nvidia0", argv0="orchestrate", new_session=True)
    nvml(backend, 0, worker)
    p = plan(backend, spawner)
    assert target_pids(p) == [launcher, worker]
    assert "same process group" in p.trees[0].targets[0].reason


def test_shell_parent_is_not_climbed_unless_a_pattern_names_it(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    argv = shlex.join(spawner.holder_argv("nvidia0"))
    token = f"job-wrapper-{uuid.uuid4().hex[:8]}"
    sh = spawner.shell(f": {token}; {argv}; sleep 30", new_session=True)
    wait_until(lambda: len(scan_processes(spawner.dev).holders_of_minor(0)) == 1, what="worker under bash")
    nvml(backend, 0, *scan_processes(spawner.dev).holders_of_minor(0))
    p = plan(backend, spawner)
    (worker,) = target_pids(p)
    assert worker != sh
    p2 = plan(backend, spawner, patterns=(token,))
    assert target_pids(p2) == [sh, worker]


def test_other_users_processes_are_reported_when_not_root(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(1)
    pid, _ = spawner.holder("nvidia0")
    nvml(backend, 0, pid)
    p = plan(backend, spawner, uid=12345)  # as if podguard ran as an unprivileged user
    assert p.targets == () and skipped(p) == {pid: "other_user"}


def test_bad_input_is_a_usage_error(spawner: Spawner) -> None:
    backend = FakeBackend.healthy(2)
    with pytest.raises(UsageError, match="GPU index 5 is out of range"):
        plan(backend, spawner, gpus=(5,))
    with pytest.raises(UsageError, match="not a valid regular expression"):
        plan(backend, spawner, patterns=("python(",))


def test_plan_is_json_ready(spawner: Spawner) -> None:
    import json

    backend = FakeBackend.healthy(2)
    launcher, worker, _ = spawner.launcher("nvidia0")
    nvml(backend, 0, worker)
    data = json.loads(json.dumps(plan(backend, spawner).to_dict()))
    assert data["trees"][0]["root"] == launcher
    assert data["holders"][0]["memory_mib"] == {"0": 2048.0}
    view = describe_holders(backend, [0, 1], dev_dir=spawner.dev)
    assert any(str(worker) in line and "fd+NVML" in line for line in view["gpus"]["0"])


# ---- pure rule checks on a synthetic process table --------------------------------------------


def _config(dev: Path, **kw: object) -> PlanConfig:
    base: dict[str, object] = {"gpus": (0,), "dev_dir": str(dev), "self_pid": 999, "minors": {0: 0}}
    base.update(kw)
    return PlanConfig(**base)  # type: ignore[arg-type]


def test_uninspectable_nvml_process_is_reported_not_stopped(tmp_path: Path) -> None:
    table = synthetic_table(
        [synthetic(1, 0, ["init"]), synthetic(50, 1, ["python3", "train.py"], fd_error="EACCES", uid=1000)]
    )
    p = build_plan(table, {0: (GpuProcess(50, GIB, "compute"),)}, _config(tmp_path))
    assert p.targets == ()
    (h,) = p.holders
    assert h.evidence is Evidence.NVML and h.memory == {0: GIB}
    assert {s.pid: s.code for s in p.skipped} == {50: "uninspectable"}
    assert p.uninspectable == (50,)


def test_container_pid1_shell_group_and_interactive_shells_stop_the_climb(tmp_path: Path) -> None:
    # PID 1 is a non-interactive entrypoint shell: every background process inherits its group 1.
    table = synthetic_table(
        [
            synthetic(1, 0, ["/bin/bash", "/start.sh"], pgid=1),
            synthetic(10, 1, ["python3", "serve.py"], pgid=1),  # same group as the worker, not a job
            synthetic(11, 10, ["python3", "worker.py"], pgid=1, devices=["nvidia0"]),
            synthetic(20, 1, ["-bash"], pgid=20),  # somebody's terminal
            synthetic(21, 20, ["python3", "-m", "torch.distributed.run", "t.py"], pgid=21),
            synthetic(22, 21, ["python3", "t.py"], pgid=21, devices=["nvidia0"]),
            synthetic(23, 22, ["python3", "t.py"], pgid=21, devices=["nvidia0"]),  # DataLoader
            synthetic(24, 21, ["python3", "-c", "helper"], pgid=21),  # a non-holder in the job
        ]
    )
    listed = (GpuProcess(11, GIB, "compute"), GpuProcess(22, GIB, "compute"))  # not 23: a forked DataLoader
    p = build_plan(table, {0: listed}, _config(tmp_path))
    roots = {t.root: [x.pid for x in t.targets] for t in p.trees}
    assert roots == {11: [11], 21: [21, 22, 24, 23]}
    roles = {t.pid: t.role for t in p.targets}
    assert roles == {11: "holder", 21: "launcher", 22: "holder", 24: "member", 23: "holder"}


def test_where_nvml_speaks_host_pids_a_local_cuda_process_is_a_holder_an_nvml_reader_is_not(spawner: Spawner) -> None:
    """In a container NVML may list host PIDs only: no local PID can be confirmed there. A local process with
    the GPU's device file and a CUDA context (nvidia-uvm) open holds it; one that only initialised NVML
    (nvidiactl + nvidia0, no nvidia-uvm: a metrics thread) does not."""

    class HostPids(FakeBackend):  # NVML as seen from a container: PIDs of the host's namespace, never alive here
        host: tuple[GpuProcess, ...] = ()

        def processes(self, index: int) -> tuple[GpuProcess, ...]:
            return super().processes(index) + (self.host if index == 0 else ())

    backend = HostPids.healthy(2)
    backend.host = (GpuProcess(4_100_000 + os.getpid() % 1000, 2 * GIB, "compute"),)  # the leftover, by host PID
    (leftover, _), (reader, _) = spawner.holders(
        {"devices": ("nvidiactl", "nvidia-uvm", "nvidia0")}, {"devices": ("nvidiactl", "nvidia0", "nvidia1")}
    )
    p = plan(backend, spawner, gpus=(0, 1))
    assert {h.pid: h.evidence for h in p.holders} == {leftover: Evidence.FD_CUDA}
    assert target_pids(p) == [leftover] and skipped(p) == {reader: "fd_only"}
    assert "another PID namespace" in p.targets[0].reason
    # where NVML names a local process on that GPU, device files alone never make a holder
    nvml(backend, 0, reader)
    assert {h.pid for h in plan(backend, spawner, gpus=(0, 1)).holders} == {reader}

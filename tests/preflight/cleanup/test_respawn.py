"""Issue 7 item 1: a respawning parent started beside podguard must not defeat the cleanup.

Real processes on the fake NVML: a plain Python parent (not a named launcher, in the test's own process
group, as a start script would leave it) restarts its GPU-holding child shortly after it dies.
"""

from __future__ import annotations

import subprocess
import sys

from fakenvml import NvmlNode, pid_alive, wait_until
from podguard.preflight.cleanup.executor import execute_cleanup, plan_cleanup
from podguard.preflight.cleanup.process_table import scan_processes

PODGUARD = [sys.executable, "-m", "podguard"]


def _no_holder_left(node: NvmlNode, backend: object) -> bool:
    return scan_processes(node.dev_dir).holders_of_minor(0) == () and backend.processes(0) == ()  # type: ignore[attr-defined]


def test_respawning_parent_becomes_the_next_root_and_success_waits_for_a_quiet_period(nvml_node: NvmlNode) -> None:
    parent = nvml_node.spawn_holder(0, 2048, respawn_worker=True, name="respawner", respawn_delay_s=0.15)
    first = parent.holder_pid
    backend = nvml_node.backend()
    plan = plan_cleanup(backend, [0], dev_dir=nvml_node.dev_dir)
    assert [t.pid for t in plan.targets] == [first]  # a plain parent is not climbed into on its own
    res = execute_cleanup(plan, backend, grace_s=2.0, busy_timeout_s=10.0)
    assert res.ok
    assert not pid_alive(parent.pid), "the parent that respawned the holder must be stopped"
    roles = {a.pid: str(a.role) for a in res.actions}
    assert roles[first] == "holder" and roles[parent.pid] == "respawner"
    (r,) = res.respawners
    assert r.pid == parent.pid and r.stopped and r.children
    # and nothing comes back afterwards
    assert not wait_until(lambda: not _no_holder_left(nvml_node, backend), timeout=0.5)


def test_cleanup_command_exits_0_only_once_quiet_and_75_naming_a_respawner_it_may_not_stop(
    cli_node: NvmlNode,
) -> None:
    ok_parent = cli_node.spawn_holder(1, 1024, respawn_worker=True, name="respawner", respawn_delay_s=0.1)
    proc = subprocess.run([*PODGUARD, "cleanup", "--gpu-list", "1"], env=cli_node.env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not pid_alive(ok_parent.pid)

    # A respawner podguard may not stop (protected by name): exit 75, and the summary names it.
    stuck = cli_node.spawn_holder(0, 1024, respawn_worker=True, name="supervisord", respawn_delay_s=0.05)
    proc = subprocess.run(
        [*PODGUARD, "cleanup", "--gpu-list", "0", "--busy-timeout", "1.5", "--grace", "0.5"],
        env=cli_node.env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 75, proc.stderr
    assert pid_alive(stuck.pid)
    assert f"pid {stuck.pid}" in proc.stderr and "keeps starting" in proc.stderr  # advice printed, not only stored
    assert "podguard cleanup: BUSY" in proc.stderr


def test_a_respawn_that_takes_long_to_reach_the_gpu_is_still_seen(nvml_node: NvmlNode) -> None:
    """A respawned `python train.py` imports torch for seconds before it opens the GPU: the same command
    started again by the same parent keeps the cleanup from declaring success until it is proven and stopped."""
    parent = nvml_node.spawn_holder(0, 2048, respawn_worker=True, name="respawner", open_delay_s=0.8)
    backend = nvml_node.backend()
    plan = plan_cleanup(backend, [0], dev_dir=nvml_node.dev_dir)
    res = execute_cleanup(plan, backend, grace_s=2.0, busy_timeout_s=10.0)
    assert res.ok and not pid_alive(parent.pid)
    assert [r.pid for r in res.respawners] == [parent.pid]
    assert not wait_until(lambda: not _no_holder_left(nvml_node, backend), timeout=1.0)

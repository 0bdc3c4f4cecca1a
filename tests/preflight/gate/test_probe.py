"""The per-GPU health probe: child processes in parallel, timeouts that kill whole process groups, the real
CUDA child reporting cleanly on a machine without CUDA, and availability decided without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podguard.errors import UsageError
from podguard.preflight.gate.probe import ProbeResult, cuda_probe_available, cuda_probe_status, run_probes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists"; it is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_healthy_probe_sees_only_its_gpu(tmp_path: Path) -> None:
    cmd = _script(
        tmp_path, "ok.sh", 'echo "cvd=$CUDA_VISIBLE_DEVICES idx=$PODGUARD_PROBE_GPU_INDEX order=$CUDA_DEVICE_ORDER"\n'
    )
    results = run_probes([(2, "GPU-aaa"), (5, "GPU-bbb")], timeout_s=10, probe_cmd=cmd)
    assert [r.index for r in results] == [2, 5]
    assert all(r.ok and r.reason == "" and r.exit_code == 0 for r in results)
    assert "cvd=GPU-aaa idx=2 order=PCI_BUS_ID" in results[0].output_tail
    assert "cvd=GPU-bbb idx=5" in results[1].output_tail
    assert results[0].visible_id == "GPU-aaa"


def test_failing_probe_is_unhealthy_with_its_last_line(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "bad.sh", 'echo "checking"\necho "ECC error on $CUDA_VISIBLE_DEVICES" >&2\nexit 3\n')
    (result,) = run_probes([(0, "GPU-x")], timeout_s=10, probe_cmd=cmd)
    assert not result.ok and not result.timed_out
    assert result.exit_code == 3
    assert result.reason == "probe exited 3: ECC error on GPU-x"
    assert "checking" in result.output_tail


def test_probe_cmd_string_is_shell_split_and_env_is_passed(tmp_path: Path) -> None:
    cmd = f'{sys.executable} -c \'import os, sys; sys.exit(0 if os.environ["EXTRA"] == "1" else 4)\''
    (result,) = run_probes([(0, "0")], timeout_s=10, probe_cmd=cmd, env={"EXTRA": "1"})
    assert result.ok, result


def test_busy_failure_is_flagged(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "busy.sh", 'echo "CUDA error: CUDA-capable device(s) is/are busy or unavailable"\nexit 1\n')
    (result,) = run_probes([(0, "GPU-x")], timeout_s=10, probe_cmd=cmd)
    assert not result.ok and result.busy


def test_hung_probe_is_killed_with_its_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # the probe starts a helper (same process group) and both hang
    cmd = _script(tmp_path, "hang.sh", f"sleep 60 &\necho $! >> {pids}\necho $$ >> {pids}\nsleep 60\n")
    start = time.monotonic()
    (result,) = run_probes([(3, "GPU-h")], timeout_s=0.5, probe_cmd=cmd)
    elapsed = time.monotonic() - start
    assert elapsed < 2.0, elapsed
    assert not result.ok and result.timed_out and result.exit_code is None
    assert result.reason == "probe timed out after 0.5s"
    recorded = [int(p) for p in pids.read_text().split()]
    assert len(recorded) == 2
    deadline = time.monotonic() + 2
    while any(_alive(p) for p in recorded) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(_alive(p) for p in recorded), "the hung probe or its helper survived"


def test_leftover_children_of_a_finished_probe_are_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # exits 0 at once but leaves a background process holding the output pipe
    cmd = _script(tmp_path, "leak.sh", f"sleep 60 &\necho $! > {pidfile}\nexit 0\n")
    start = time.monotonic()
    (result,) = run_probes([(0, "GPU-l")], timeout_s=10, probe_cmd=cmd)
    assert result.ok
    assert time.monotonic() - start < 2.0
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 2
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(pid)


def test_probes_run_in_parallel(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "slow.sh", "sleep 0.3\n")
    start = time.monotonic()
    results = run_probes([(i, f"GPU-{i}") for i in range(4)], timeout_s=10, probe_cmd=cmd)
    elapsed = time.monotonic() - start
    assert all(r.ok for r in results)
    assert all(r.duration_ms >= 290 for r in results)
    assert elapsed < 1.15, f"4 probes of 0.3 s took {elapsed:.2f}s: not parallel (sequential: 1.2 s)"


def test_mixed_results_keep_gpu_order(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "mixed.sh", '[ "$PODGUARD_PROBE_GPU_INDEX" = 1 ] && exit 7\nexit 0\n')
    results = run_probes([(0, "a"), (1, "b"), (2, "c")], timeout_s=10, probe_cmd=cmd)
    assert [(r.index, r.ok) for r in results] == [(0, True), (1, False), (2, True)]
    assert results[1].exit_code == 7


def test_chatty_probe_does_not_block_on_a_full_pipe(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; sys.stdout.write('x' * 1_000_000 + '\\nlast line\\n')"]
    (result,) = run_probes([(0, "0")], timeout_s=10, probe_cmd=cmd)
    assert result.ok
    assert result.output_tail.endswith("last line\n")
    assert len(result.output_tail) <= 2000


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        ("", "empty"),
        ("'unterminated", "cannot be parsed"),
        ("no-such-probe-program-xyz --gpu", "not on PATH"),
        ("/nonexistent/probe", "does not exist"),
    ],
)
def test_bad_probe_cmd_is_a_usage_error(cmd: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_probes([(0, "0")], timeout_s=1, probe_cmd=cmd)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="timeout"):
        run_probes([(0, "0")], timeout_s=0, probe_cmd="true")
    with pytest.raises(UsageError, match="listed twice"):
        run_probes([(0, "a"), (0, "b")], timeout_s=1, probe_cmd="true")


def test_no_gpus_means_no_probes() -> None:
    assert run_probes([], timeout_s=1, probe_cmd="true") == []


def test_result_serialises_for_the_report() -> None:
    result = ProbeResult(index=1, ok=False, reason="probe timed out after 5s", duration_ms=5000.0, timed_out=True)
    assert json.loads(json.dumps(result.to_dict()))["reason"] == "probe timed out after 5s"


def test_cuda_probe_availability_without_importing_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from podguard.preflight.gate.probe import cuda_probe_status; "
        "print(cuda_probe_status()); assert 'torch' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "False" in out  # CPU-only torch here, and no driver


def test_cuda_probe_availability_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    # a fake CUDA build of torch in a directory of its own
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '12.4'\n")
    devdir = tmp_path / "dev"
    devdir.mkdir()
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "torch":
            return importlib.util.spec_from_file_location(
                "torch", fake / "__init__.py", submodule_search_locations=[str(fake)]
            )
        return real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    no_driver = not Path("/proc/driver/nvidia/version").exists()
    if no_driver:
        ok, why = cuda_probe_status(devdir)
        assert not ok and "no NVIDIA driver" in why
    (devdir / "nvidiactl").write_text("")
    assert cuda_probe_available(devdir)
    monkeypatch.setenv("PODGUARD_DEV_DIR", str(devdir))
    assert cuda_probe_available()
    (fake / "version.py").write_text("cuda = None\n")
    ok, why = cuda_probe_status(devdir)
    assert not ok and "CPU-only" in why


@pytest.mark.slow
def test_real_cuda_child_reports_cuda_unavailable_cleanly() -> None:
    """The built-in probe on this CPU-only machine: exit 1, one JSON line, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "podguard.preflight.gate.probe.cuda_child"],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-test"},
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert report["ok"] is False
    assert "CUDA not available" in report["error"] and "GPU-test" in report["error"]
    assert report["ms"] > 0


@pytest.mark.slow
def test_run_probes_with_the_default_cuda_child() -> None:
    """Through run_probes, in a fresh interpreter that must not import torch itself."""
    code = (
        "import json, sys; from podguard.preflight.gate.probe import run_probes; "
        "r = run_probes([(4, 'GPU-cpu-only')], timeout_s=60)[0]; "
        "assert 'torch' not in sys.modules, 'the caller imported torch'; print(json.dumps(r.to_dict()))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["index"] == 4 and not result["ok"] and not result["timed_out"] and not result["busy"]
    assert result["exit_code"] == 1
    assert result["reason"].startswith("CUDA probe failed: CUDA not available")
    assert "Traceback" not in result["output_tail"]


# ---- Issue 7 item 14: no fork with Python code (preexec_fn) while the XID watcher thread runs --------------


def test_probe_children_are_started_without_preexec_fn_and_before_the_xid_watcher(nvml_node, tmp_path, monkeypatch):
    """Forking with `preexec_fn` while another thread runs can deadlock the child (a lock held by that thread
    at fork time stays held). The gate must start its probe children with no Python code between fork and
    exec, and before the XID watcher thread exists."""
    import subprocess as sp
    import threading

    from podguard.preflight.gate.probe import runner
    from podguard.preflight.options import PreflightOptions
    from podguard.preflight.pipeline import run_preflight

    seen: list[tuple[object, list[str]]] = []
    real_popen = sp.Popen
    before = set(threading.enumerate())  # threads other tests in this process left behind are not ours

    def recording_popen(*args, **kwargs):
        threads = [t.name for t in threading.enumerate() if t not in before]
        seen.append((kwargs.get("preexec_fn"), threads))
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", recording_popen)
    probe = _script(tmp_path, "ok.sh", "exit 0\n")
    opts = PreflightOptions(command="health", gpu_list="0,1", probe_cmd=probe, state_dir=tmp_path / "state")
    result = run_preflight(opts)
    assert result.exit_code == 0, result.summary
    assert len(seen) == 2
    for preexec_fn, threads in seen:
        assert preexec_fn is None
        assert threads == [], f"probe forked while other threads ran: {threads}"


def test_a_probe_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cmd = _script(tmp_path, "hang.sh", f"echo $$ > {pidfile}\nexec sleep 60\n")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from podguard.preflight.gate.probe import run_probes; "
            "run_probes([(0, 'GPU-x')], timeout_s=60, probe_cmd=sys.argv[1])",
            cmd,
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = int(pidfile.read_text())
        assert _alive(pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 2
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(pid), "the probe outlived its SIGKILLed parent"

"""The cross-rank lock with real processes: serializing, slots, a SIGKILLed holder, per-host folders on a
shared volume, and a volume without flock."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from containersim import in_container, nolock_env, require_namespaces
from podguard.errors import PodguardError, UsageError
from podguard.state import host_id


def _py(code: str, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


LOCK_HOLDER = """
import json, os, sys, time
from podguard.rank import serialized
lock_dir, hold_s, slots = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with serialized("compile", slots=slots, lock_dir=lock_dir) as hold:
    start = time.time()
    print("HELD", flush=True)
    time.sleep(hold_s)
    end = time.time()
print(json.dumps({"start": start, "end": end, "slot": hold.slot, "waited": hold.waited_s}), flush=True)
"""


def _holders(tmp_path: Path, n: int, hold_s: float, slots: int) -> list[subprocess.Popen[str]]:
    script = tmp_path / "holder.py"
    script.write_text(LOCK_HOLDER)
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank)}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / "locks"), str(hold_s), str(slots)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    return procs


def _intervals(procs: list[subprocess.Popen[str]]) -> tuple[list[dict[str, float]], str]:
    spans, text = [], ""
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        text += out
        spans.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(spans, key=lambda s: s["start"]), text


def test_lock_serializes_three_processes(tmp_path: Path) -> None:
    spans, text = _intervals(_holders(tmp_path, 3, 0.3, 1))
    for before, after in itertools.pairwise(spans):
        assert after["start"] >= before["end"], f"overlap: {spans}"
    assert "LOCK: waiting for 'compile'" in text
    assert "LOCK: acquired 'compile' slot 0/1 after waiting" in text
    assert "LOCK: released 'compile' slot 0 (held" in text
    assert max(s["waited"] for s in spans) >= 0.25


def test_lock_with_two_slots_lets_two_through(tmp_path: Path) -> None:
    spans, _ = _intervals(_holders(tmp_path, 4, 0.4, 2))
    events = sorted([(s["start"], 1) for s in spans] + [(s["end"], -1) for s in spans])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert peak == 2
    assert {s["slot"] for s in spans} == {0, 1}


KILLED_HOLDER = """
import os, sys, time
from podguard.rank import serialized
with serialized("import", lock_dir=sys.argv[1]):
    if sys.argv[2] == "fork":
        child = os.fork()
        if child == 0:  # a DataLoader-like worker that outlives its parent
            time.sleep(60)
            os._exit(0)
        print(f"CHILD {child}", flush=True)
    print("HELD", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_sigkilled_holder_does_not_leave_the_lock_stuck(tmp_path: Path, mode: str) -> None:
    script = _py(KILLED_HOLDER, tmp_path, "killed.py")
    holder = subprocess.Popen([sys.executable, str(script), str(tmp_path), mode], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert holder.stdout is not None
        for line in holder.stdout:  # the lock's own log lines come first
            if line.startswith("CHILD "):
                child = int(line.split()[1])
            if line.strip() == "HELD":
                break
        assert (child is not None) == (mode == "fork")
        from podguard.rank import serialized

        with pytest.raises(PodguardError) as info, serialized("import", lock_dir=tmp_path, timeout_s=0.2):
            pass
        assert info.value.code == 75 and f"pid {holder.pid}" in info.value.message
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        start = time.monotonic()
        with serialized("import", lock_dir=tmp_path, timeout_s=5) as hold:
            assert hold.slot == 0
        assert time.monotonic() - start < 1.0
    finally:
        holder.kill()
        holder.wait()
        if child is not None:
            os.kill(child, signal.SIGKILL)


def test_lock_default_dir_is_this_hosts_folder_in_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from podguard.rank import serialized

    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    with serialized("import", log=False) as hold:
        assert hold.path == tmp_path / "state" / "locks" / host_id() / "import.0.lock"
        assert json.loads(hold.path.read_text())["pid"] == os.getpid()
        assert hold.path.stat().st_mode & 0o077 == 0


POD_HOLDER = """
import sys, time
from podguard.errors import PodguardError
from podguard.rank import serialized
try:
    with serialized("import", timeout_s=float(sys.argv[1]), log=False):
        print("HELD", flush=True)
        sys.stdin.readline()  # hold until told
except PodguardError as exc:
    print("TIMEOUT", exc.message, flush=True)
"""


def _pod(tmp_path: Path, hostname: str, timeout_s: float, env: dict[str, str]) -> subprocess.Popen[str]:
    script = _py(POD_HOLDER, tmp_path, "pod_holder.py")
    argv = in_container([sys.executable, str(script), str(timeout_s)], hostname=hostname)
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def test_pods_sharing_a_volume_do_not_wait_for_each_others_import_lock(tmp_path: Path) -> None:
    """Issue 7 item 11: the default lock folder is per host; the ranks of one host still take turns."""
    require_namespaces()
    env = {**os.environ, "PODGUARD_STATE_DIR": str(tmp_path / "volume")}
    holder = _pod(tmp_path, "pod-a", 10, env)
    others = []
    try:
        assert _first_line(holder) == "HELD"
        others = [_pod(tmp_path, "pod-b", 0.5, env), _pod(tmp_path, "pod-a", 0.5, env)]
        other_pod, same_pod = (_first_line(p) for p in others)
        assert other_pod == "HELD"  # another pod's ranks are not serialised behind ours
        assert same_pod.startswith("TIMEOUT") and "pid 1 rank 0" in same_pod  # ... this pod's ranks are
    finally:
        for proc in [holder, *others]:
            proc.kill()
            proc.wait()
    assert sorted(p.name for p in (tmp_path / "volume" / "locks").iterdir()) == ["pod-a", "pod-b"]


def test_a_lock_folder_without_flock_falls_back_to_a_host_local_one(tmp_path: Path) -> None:
    """ENOLCK (NFS without a lock daemon) is no traceback: the lock moves to a host-local folder and still
    serializes this host's ranks."""
    script = _py(LOCK_HOLDER, tmp_path, "holder.py")
    env = {**os.environ, **nolock_env(tmp_path / "locks"), "TMPDIR": str(tmp_path / "local")}
    (tmp_path / "local").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "locks"), "0.3", "1"],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    spans, text = _intervals(procs)
    assert spans[1]["start"] >= spans[0]["end"], spans
    assert "has no file locks" in text and str(tmp_path / "local") in text
    assert "Traceback" not in text


@pytest.mark.parametrize(("kwargs", "message"), [({"name": "../x"}, "lock name"), ({"slots": 0}, "slots=0")])
def test_lock_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    from podguard.rank import serialized

    with pytest.raises(UsageError, match=message), serialized(lock_dir=tmp_path, **kwargs):
        pass

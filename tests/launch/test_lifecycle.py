"""Outcome records and the restart policy: what a restarted container does with a job's history.

The end-to-end versions (real `podguard train` as a container's PID 1) are in test_lifecycle_train.py.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from containersim import in_container, nolock_env, require_namespaces
from podguard import console
from podguard.job.restart_guard import (
    LaunchAction,
    LaunchDecision,
    RunKind,
    backoff_delay,
    backoff_wait,
    idle,
    job_key,
    load_history,
    plan_launch,
    record_outcome,
    record_run,
)
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec


def _runs(tmp_path: Path, key: str, results: list[tuple[int, float, int | None]], **fields: object) -> None:
    """Record runs as if by an earlier container instance (`container="old"`) of this pod."""
    now = time.time()
    for code, duration, sig in results:
        path = record_run(
            key=key, argv=["python", "t.py"], mode="per-gpu", exit_code=code, started_at=now - duration,
            ended_at=now, signal_num=sig, state=tmp_path,
        )  # fmt: skip
        assert path is not None
        data = json.loads(path.read_text())
        data["history"][-1].update({"container": "old", **fields})
        path.write_text(json.dumps(data))


def test_finished_job_is_not_rerun_after_a_container_restart(tmp_path: Path):
    key = job_key(["python", "t.py"], "per-gpu", cwd="/w")
    assert plan_launch(key, entry=True, state=tmp_path).action is LaunchAction.RUN  # no history yet
    outcome = run_job([WorkerSpec("job", ("true",))], terminal=io.BytesIO())
    record_outcome(outcome, key=key, argv=["true"], mode="single", started_at=time.time() - 1, state=tmp_path)
    assert load_history(key, tmp_path)[-1].exit_code == 0
    # same container instance (a person re-running it): run; the entry process after a restart: skip
    assert plan_launch(key, entry=True, state=tmp_path).action is LaunchAction.RUN
    assert plan_launch(key, entry=False, state=tmp_path, container="new").action is LaunchAction.RUN
    decision = plan_launch(key, entry=True, state=tmp_path, container="new")
    assert decision.action is LaunchAction.SKIP and "--rerun" in decision.reason and decision.delay_s == 0
    assert plan_launch(key, entry=True, rerun=True, state=tmp_path, container="new").action is LaunchAction.RUN


def test_a_new_pod_on_the_same_volume_is_another_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Issue 7 item 9: "already finished" is per pod; the volume is shared, the pod is not."""
    monkeypatch.setenv("RUNPOD_POD_ID", "pod-a")
    key_a = job_key(["python", "t.py"], "per-gpu", cwd="/w")
    _runs(tmp_path, key_a, [(0, 500.0, None)])
    assert plan_launch(key_a, entry=True, state=tmp_path, container="new").action is LaunchAction.SKIP
    monkeypatch.setenv("RUNPOD_POD_ID", "pod-b")
    key_b = job_key(["python", "t.py"], "per-gpu", cwd="/w")
    assert key_b != key_a
    assert plan_launch(key_b, entry=True, state=tmp_path, container="new").action is LaunchAction.RUN
    # a record that names another pod (an older record, or a copied volume) never skips here either
    decision = plan_launch(key_a, entry=True, state=tmp_path, container="new")
    assert decision.action is LaunchAction.RUN and "another pod (pod-a)" in decision.reason
    monkeypatch.delenv("RUNPOD_POD_ID")
    assert job_key(["python", "t.py"], "per-gpu", cwd="/w", pod="h1") != job_key(
        ["python", "t.py"], "per-gpu", cwd="/w", pod="h2"
    )


def test_crash_loop_backs_off_exponentially(tmp_path: Path):
    assert [backoff_delay(k) for k in (0, 1, 2, 3, 4, 10)] == [0, 0, 10, 20, 40, 300]
    _runs(tmp_path, "k1", [(1, 5.0, None)])
    assert plan_launch("k1", entry=True, state=tmp_path, container="new").action is LaunchAction.RUN
    _runs(tmp_path, "k3", [(1, 5.0, None)] * 3)
    decision = plan_launch("k3", entry=True, state=tmp_path, container="new")
    assert decision.action is LaunchAction.BACKOFF and decision.delay_s == 20
    assert "crashed within 60 s of starting 3 times in a row" in decision.reason
    _runs(tmp_path, "slow", [(1, 5.0, None), (1, 500.0, None)])  # it ran a while: not a crash loop
    assert plan_launch("slow", entry=True, state=tmp_path, container="new").action is LaunchAction.RUN
    _runs(tmp_path, "stopped", [(143, 5.0, 15)] * 3)  # docker stop is not a crash
    assert plan_launch("stopped", entry=True, state=tmp_path, container="new").action is LaunchAction.RUN
    later = time.time() + 2 * 3600  # crashes long ago are not a loop
    assert plan_launch("k3", entry=True, state=tmp_path, container="new", now=later).action is LaunchAction.RUN


def test_start_failures_count_as_crashes(tmp_path: Path):
    """Issue 7 item 10: a preflight failure (76, 75) is an exit of the entry process like any other."""
    for code in (76, 75):
        record_run(
            key="pf", argv=["t"], mode="auto", exit_code=code, started_at=time.time() - 1, kind=RunKind.START,
            root_cause="preflight", detail="GPU(s) 0 failed the health check", state=tmp_path,
        )  # fmt: skip
    history = load_history("pf", tmp_path)
    assert [(r.kind, r.exit_code, r.root_cause) for r in history] == [
        (RunKind.START, 76, "preflight"),
        (RunKind.START, 75, "preflight"),
    ]
    decision = plan_launch("pf", entry=True, state=tmp_path, container="new")
    assert decision.action is LaunchAction.BACKOFF and decision.delay_s == 10


def test_skips_that_loop_are_slowed_down_and_never_push_the_finished_run_out(tmp_path: Path):
    _runs(tmp_path, "done", [(0, 500.0, None)])
    for _ in range(30):  # a container restarted over and over after the job finished
        record_run(
            key="done", argv=["t"], mode="auto", exit_code=0, started_at=time.time(), kind=RunKind.SKIP,
            state=tmp_path,
        )  # fmt: skip
    history = load_history("done", tmp_path)
    assert [(r.kind, r.count) for r in history] == [(RunKind.JOB, 1), (RunKind.SKIP, 30)]
    decision = plan_launch("done", entry=True, state=tmp_path, container="new")
    assert decision.action is LaunchAction.SKIP and decision.delay_s == 300
    assert "--on-exit idle" in decision.reason
    # --rerun runs it at once: skips are not crashes
    assert plan_launch("done", entry=True, rerun=True, state=tmp_path, container="new").action is LaunchAction.RUN


def test_records_are_owner_only_and_redacted(tmp_path: Path):
    """Issue 7 item 13 (launch side): the job's argv and free text in outcome records are redacted."""
    token = "hf_" + "a1B2" * 8
    path = record_run(
        key="sec", argv=["python", "t.py", "--hf_token", token, "--lr=3e-4"], mode="single", exit_code=1,
        started_at=time.time(), detail=f"worker said HF_TOKEN={token}", state=tmp_path,
    )  # fmt: skip
    assert path is not None
    text = path.read_text()
    assert token not in text
    data = json.loads(text)
    assert data["command"] == ["python", "t.py", "--hf_token", "***", "--lr=3e-4"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_unreadable_or_foreign_records_do_not_stop_a_start(tmp_path: Path):
    path = tmp_path / "jobs" / "odd.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"history": [{"exit_code": "x"}, "junk", {"exit_code": 0}]}))
    assert load_history("odd", tmp_path) == []  # no usable run (the last lacks its times)
    path.write_text("{not json")
    assert plan_launch("odd", entry=True, state=tmp_path, container="new").action is LaunchAction.RUN


FULL_VOLUME = """
import json, sys, time
from pathlib import Path
from podguard.job.restart_guard import record_run
state = Path(sys.argv[1])
(state / "jobs").mkdir()
try:  # fill the volume, as a job's checkpoints do
    with open(state / "fill", "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
except OSError as exc:
    print("filled:", exc.strerror, flush=True)
paths = [record_run(key="k", argv=["t"], mode="single", exit_code=3, started_at=time.time(), state=state)
         for _ in range(2)]
print(json.dumps([str(p) if p else None for p in paths]))
print("leftovers:", sorted(p.name for p in (state / "jobs").iterdir() if p.name.endswith(".tmp")))
"""


def test_recording_on_a_full_volume_warns_once_and_never_raises(tmp_path: Path):
    """Issue 7 item 8: a real ENOSPC (a 1 MiB tmpfs) costs the record, not the caller's exit code."""
    require_namespaces()
    state = tmp_path / "state"
    state.mkdir()
    argv = in_container([sys.executable, "-c", FULL_VOLUME, str(state)], tmpfs=state, tmpfs_size="1m")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "filled: No space left on device" in proc.stdout
    assert "[null, null]" in proc.stdout and "leftovers: []" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "could not record how this run ended" in warnings[0], proc.stderr
    assert "No space left on device" in warnings[0] and "Traceback" not in proc.stderr


def test_records_on_a_volume_without_flock(tmp_path: Path):
    """Issue 7 item 11: ENOLCK from the volume is not a traceback; the record is still written."""
    code = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from podguard.job.restart_guard import load_history, record_run
        state = Path(sys.argv[1])
        for n in range(2):
            assert record_run(key="k", argv=["t"], mode="single", exit_code=n, started_at=time.time(), state=state)
        print([r.exit_code for r in load_history("k", state)])
        """
    )
    env = {**os.environ, **nolock_env(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[0, 1]", proc.stderr
    assert proc.stderr == ""


def test_backoff_and_idle_end_on_a_signal():
    def signal_main_soon() -> None:
        threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGTERM)).start()

    signal_main_soon()
    t0 = time.monotonic()
    decision = LaunchDecision(LaunchAction.BACKOFF, "waiting 30 s", delay_s=30)
    with console.captured() as said:
        got = backoff_wait(decision, step_s=0.1)
    assert got == signal.SIGTERM and time.monotonic() - t0 < 5
    text = "\n".join(said)
    assert "podguard: launching again in" in text and "not launching" in text
    signal_main_soon()
    with console.captured() as said:
        assert idle(3, Path("/state/jobs/x.json")) == 3
    assert "outcome recorded in /state/jobs/x.json" in "\n".join(said)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

"""The supervisor with real processes and real signals: fail fast, forwarding, grace, reaping, orphans."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podguard.errors import UsageError
from podguard.launch.process import pdeathsig_wrapper
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec
from podguard.launch.supervisor import DEFAULT_GRACE_S, Controller, Supervisor
from podguard.procfs import children_of

HELPER = Path(__file__).with_name("_launch_helper.py")
PY = sys.executable

# A worker that records its pid, reports SIGTERM/SIGINT in a file, then exits 0 (or ignores them).
_WORKER = r"""
import os, signal, sys, time
d, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def on_sig(num, frame):
    with open(os.path.join(d, name + ".sig"), "a") as fh:
        fh.write(signal.Signals(num).name + "\n")
    if mode != "ignore":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_sig)
signal.signal(signal.SIGINT, on_sig)
signal.signal(signal.SIGUSR1, on_sig if mode == "usr1" else signal.SIG_DFL)
if mode == "orphan":  # a grandchild in its own session, like torchrun's workers
    import subprocess
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    open(os.path.join(d, name + ".grandchild"), "w").write(str(g.pid))
open(os.path.join(d, name + ".pid"), "w").write(str(os.getpid()))
print(name, "ready", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _worker(d: Path, name: str, mode: str = "term") -> WorkerSpec:
    return WorkerSpec(name, (PY, "-c", _WORKER, str(d), name, mode), prefix=f"{name}:")


def _wait_for(paths: list[Path], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    """No such process (or only a zombie that someone else must reap)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _exit_after(seconds: float, code: int) -> tuple[str, ...]:
    return (PY, "-c", f"import time,sys; print('working', flush=True); time.sleep({seconds}); sys.exit({code})")


def test_grace_default_fits_docker_stop_timeout():
    assert 0 < DEFAULT_GRACE_S <= 8  # docker stop: SIGKILL after 10 s; leave time to record the outcome


def test_all_workers_succeed():
    out = io.BytesIO()
    outcome = run_job([WorkerSpec(f"GPU{i}", _exit_after(0.05, 0), prefix=f"GPU{i}:") for i in range(3)], terminal=out)
    assert outcome.exit_code == 0 and outcome.root_cause is None
    assert [w.returncode for w in outcome.workers] == [0, 0, 0]
    assert out.getvalue().count(b"working") == 3 and b"finished successfully" in out.getvalue()


def test_first_failure_stops_the_rest_within_the_grace_and_its_code_comes_out(tmp_path: Path):
    specs = [
        _worker(tmp_path, "GPU0"),
        WorkerSpec("GPU1", _exit_after(0.3, 3), prefix="GPU1:"),
        _worker(tmp_path, "GPU2"),
    ]
    out = io.BytesIO()
    t0 = time.monotonic()
    outcome = run_job(specs, grace_s=5, terminal=out)
    elapsed = time.monotonic() - t0
    assert outcome.exit_code == 3
    assert outcome.root_cause is not None and outcome.root_cause.name == "GPU1"
    assert outcome.root_cause.tail == ("working",)
    assert elapsed < 4  # the others exit on SIGTERM; nobody waited for the 5 s grace
    assert (tmp_path / "GPU0.sig").read_text() == "SIGTERM\n" and (tmp_path / "GPU2.sig").read_text() == "SIGTERM\n"
    others = [w for w in outcome.workers if w.name != "GPU1"]
    assert all(w.stopped_by_podguard and not w.failed for w in others)
    text = out.getvalue().decode()
    assert "GPU1 exited with code 3; stopping the other 2 worker(s)" in text
    assert "last 1 line(s) of GPU1:" in text and "| working" in text


def test_worker_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path):
    specs = [_worker(tmp_path, "GPU0", "ignore"), WorkerSpec("GPU1", _exit_after(0.3, 5))]
    t0 = time.monotonic()
    outcome = run_job(specs, grace_s=0.5, terminal=io.BytesIO())
    elapsed = time.monotonic() - t0
    assert outcome.exit_code == 5
    stubborn = next(w for w in outcome.workers if w.name == "GPU0")
    assert stubborn.signal == signal.SIGKILL and stubborn.stopped_by_podguard
    assert (tmp_path / "GPU0.sig").read_text() == "SIGTERM\n"
    assert 0.5 <= elapsed < 4


def test_killed_by_signal_gives_128_plus_n_and_a_hint():
    code = "import os, signal; print('boom', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    out = io.BytesIO()
    outcome = run_job([WorkerSpec("GPU3", (PY, "-c", code), label="GPU3 (rank 3)")], terminal=out)
    assert outcome.exit_code == 137
    assert outcome.root_cause is not None and outcome.root_cause.signal == 9
    assert "GPU3 (rank 3) was killed by SIGKILL (signal 9)" in outcome.detail
    assert "out-of-memory" in out.getvalue().decode()


def test_bad_command_is_a_usage_error_before_anything_starts(tmp_path: Path):
    with pytest.raises(UsageError, match="not found on PATH"):
        run_job([_worker(tmp_path, "GPU0"), WorkerSpec("GPU1", ("no-such-program-xyz",))], terminal=io.BytesIO())
    assert not (tmp_path / "GPU0.pid").exists()
    with pytest.raises(UsageError, match="unique"):
        run_job([WorkerSpec("a", ("true",)), WorkerSpec("a", ("true",))], terminal=io.BytesIO())
    with pytest.raises(UsageError, match="grace"):
        Supervisor(grace_s=-1)


def test_usr1_is_forwarded_without_stopping_and_state_is_restored(tmp_path: Path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGCHLD)

    class SendUsr1(Controller):
        def on_start(self, sup: Supervisor) -> None:
            sup.start(_worker(tmp_path, "w", "usr1"))
            ignore = (  # stays up until the other worker has handled USR1 (deadline 10 s), then exits 0
                "import os, signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); "
                f"open({str(tmp_path / 'late.pid')!r}, 'w').write('1'); end = time.monotonic() + 10\n"
                f"while not os.path.exists({str(tmp_path / 'w.sig')!r}) and time.monotonic() < end: time.sleep(0.01)"
            )
            sup.start(WorkerSpec("late", (PY, "-c", ignore)))

            def poke() -> None:
                if (tmp_path / "w.pid").exists() and (tmp_path / "late.pid").exists():
                    os.kill(os.getpid(), signal.SIGUSR1)
                else:
                    sup.call_later(0.05, poke)

            sup.call_later(0.05, poke)

    sup = Supervisor(grace_s=1, terminal=io.BytesIO(), summary=False)
    outcome = sup.run(SendUsr1())
    assert (tmp_path / "w.sig").read_text() == "SIGUSR1\n"
    assert outcome.exit_code == 0  # the worker chose to exit 0 on USR1; nothing was stopped
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGCHLD)) == before


def _run_helper(tmp_path: Path, specs: list[WorkerSpec], *, grace: float = 3.0, **extra) -> subprocess.Popen:
    config = {
        "specs": [{"name": s.name, "argv": list(s.argv), "prefix": s.prefix} for s in specs],
        "grace": grace,
        "out": str(tmp_path / "out.txt"),
        "result": str(tmp_path / "result.json"),
        **extra,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return subprocess.Popen([PY, str(HELPER), str(tmp_path / "config.json")])


def test_sigterm_to_podguard_reaches_every_worker_exit_143_and_no_orphans(tmp_path: Path):
    specs = [_worker(tmp_path, "GPU0"), _worker(tmp_path, "GPU1"), _worker(tmp_path, "GPU2", "orphan")]
    proc = _run_helper(tmp_path, specs)
    _wait_for([tmp_path / f"GPU{i}.pid" for i in range(3)] + [tmp_path / "GPU2.grandchild"])
    pids = [int((tmp_path / f"GPU{i}.pid").read_text()) for i in range(3)]
    grandchild = int((tmp_path / "GPU2.grandchild").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 143
    for i in range(3):
        assert (tmp_path / f"GPU{i}.sig").read_text() == "SIGTERM\n"  # exactly one copy each
    assert all(_gone(pid) for pid in [*pids, grandchild])  # the grandchild in its own session too
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["exit_code"] == 143 and result["signal"] == signal.SIGTERM
    out = (tmp_path / "out.txt").read_text()
    assert "received SIGTERM: forwarding it to 3 worker(s)" in out
    assert "leftover process(es) of the job" in out


def test_second_sigint_kills_at_once(tmp_path: Path):
    proc = _run_helper(tmp_path, [_worker(tmp_path, "GPU0", "ignore"), _worker(tmp_path, "GPU1", "ignore")], grace=30)
    _wait_for([tmp_path / "GPU0.pid", tmp_path / "GPU1.pid"])
    pids = [int((tmp_path / f"GPU{i}.pid").read_text()) for i in range(2)]
    proc.send_signal(signal.SIGINT)
    _wait_for([tmp_path / "GPU0.sig", tmp_path / "GPU1.sig"])
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 130
    assert time.monotonic() - t0 < 5  # not the 30 s grace
    assert all(_gone(pid) for pid in pids)
    assert "second SIGINT: SIGKILL now" in (tmp_path / "out.txt").read_text()


@pytest.mark.parametrize("no_setpriv", [False, True], ids=["setpriv", "python-wrapper"])
def test_workers_get_sigterm_when_podguard_is_killed(tmp_path: Path, no_setpriv: bool):
    if not no_setpriv and pdeathsig_wrapper(signal.SIGTERM)[0] == PY:
        pytest.skip("no setpriv with --pdeathsig on this machine")
    proc = _run_helper(tmp_path, [_worker(tmp_path, "GPU0")], no_setpriv=no_setpriv)
    _wait_for([tmp_path / "GPU0.pid"])
    pid = int((tmp_path / "GPU0.pid").read_text())
    proc.kill()  # SIGKILL: podguard cannot forward anything; the parent-death signal does it
    proc.wait()
    _wait_for([tmp_path / "GPU0.sig"], timeout=5)
    assert (tmp_path / "GPU0.sig").read_text() == "SIGTERM\n"
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _gone(pid)


def test_orphan_left_by_a_successful_job_is_stopped_and_reaped(tmp_path: Path):
    code = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        f"open({str(tmp_path / 'g.pid')!r}, 'w').write(str(g.pid))\n"
    )
    out = io.BytesIO()
    outcome = run_job([WorkerSpec("job", (PY, "-c", code))], terminal=out, grace_s=2)
    grandchild = int((tmp_path / "g.pid").read_text())
    assert outcome.exit_code == 0
    assert _gone(grandchild)
    assert grandchild not in children_of(os.getpid())
    assert b"stopping leftover process(es) of the job" in out.getvalue()

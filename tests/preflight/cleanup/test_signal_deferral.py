"""Issue 7 item 5: a SIGTERM/SIGINT/SIGHUP reaching podguard while it has processes frozen (between SIGSTOP and
SIGCONT/SIGKILL) is deferred until they are thawed or killed, then acted on: no process is left in state T.

The cleanup runs in a real child process with Python's default SIGTERM disposition (die at once). A hook in
the /proc re-listing that happens inside each frozen window sends the signal at exactly that moment.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from fakenvml import NvmlNode, wait_until
from podguard.preflight.cleanup.process_table import read_stat

CLEANUP = textwrap.dedent(
    """
    import os, signal, sys
    import podguard.preflight.cleanup.executor as executor
    try:
        import podguard.preflight.cleanup.stopround as window_module
    except ImportError:
        window_module = executor
    from podguard.gpu.factory import open_backend
    which, sig = int(sys.argv[1]), int(sys.argv[2])
    real = window_module.scan_processes
    calls = []
    def hooked(*args, **kwargs):
        if kwargs.get("fds") is False:  # the re-listing done while the trees are frozen
            calls.append(1)
            if len(calls) == which:
                os.kill(os.getpid(), sig)
        return real(*args, **kwargs)
    window_module.scan_processes = hooked
    # the default disposition, like a plain process: also under `nohup` (SIGHUP ignored, inherited: a suite
    # started with nohup saw "finished without the signal") and for SIGINT (Python's own handler)
    signal.signal(sig, signal.SIG_DFL)
    backend = open_backend()
    plan = executor.plan_cleanup(backend, [0], dev_dir=os.environ["PODGUARD_DEV_DIR"])
    executor.execute_cleanup(plan, backend, grace_s=0.2, busy_timeout_s=2, kill_timeout_s=2)
    print("finished without the signal", flush=True)
    """
)


def _state(pid: int) -> str | None:
    st = read_stat(pid)
    return st.state if st is not None else None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("window", [1, 2], ids=["freeze-term-thaw", "freeze-kill"])
def test_a_signal_during_a_frozen_window_is_deferred_and_nothing_stays_stopped(
    nvml_node: NvmlNode, window: int, sig: signal.Signals
) -> None:
    holder = nvml_node.spawn_holder(0, 2048, ignore_sigterm=True)
    proc = subprocess.run(
        [sys.executable, "-c", CLEANUP, str(window), str(int(sig))],
        env=nvml_node.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == -sig, (proc.returncode, proc.stderr)  # the signal was acted on afterwards
    wait_until(lambda: _state(holder.pid) != "T", timeout=1.0)
    assert _state(holder.pid) != "T", "podguard died with the GPU holder still stopped (state T)"
    if window == 2:  # SIGKILL had been sent before the deferred signal was delivered
        assert wait_until(lambda: holder.poll() is not None, timeout=5.0)

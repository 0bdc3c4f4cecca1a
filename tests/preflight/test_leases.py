"""GPU and port leases between concurrent runs on one host, with real processes holding real flocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.gpu.selected import SelectedGpu, Selection
from podguard.launch.ports import allocate_master_port, master_port_from_env, port_in_use
from podguard.preflight.leases import acquire_gpus, current_gpu_leases

GPUS = tuple(SelectedGpu(i, f"GPU-{i:08d}-0000-0000-0000-00000000000{i}", f"GPU-{i:08d}-x") for i in range(4))

# A stand-in run: leases GPUs (+ a port), prints what it got as one JSON line, holds them until its
# stdin closes (or it is killed), then releases.
HOLDER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from podguard.launch.ports import allocate_master_port
    from podguard.preflight.leases import acquire_gpus
    from podguard.gpu.selected import SelectedGpu
    lease_dir, explicit, count, indices, command = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), \\
        [int(i) for i in sys.argv[4].split(",")], sys.argv[5]
    gpus = [SelectedGpu(i, f"GPU-{i:08d}-0000-0000-0000-00000000000{i}", f"GPU-{i:08d}-x") for i in indices]
    with acquire_gpus(gpus, None if explicit else count, explicit=explicit, lease_dir=lease_dir, command=command,
                      wait=True, timeout_s=20) as lease, \\
         allocate_master_port(lease_dir=lease_dir, command=command, start=int(sys.argv[6])) as port:
        print(json.dumps({"gpus": list(lease.indices), "port": port.port}), flush=True)
        sys.stdin.read()
    """
)


class Holder:
    def __init__(
        self,
        lease_dir: Path,
        indices: str,
        *,
        explicit: bool = True,
        count: int = 2,
        command: str = "podguard train -- python a.py",
        port_start: int = 29500,
    ) -> None:
        argv = [sys.executable, "-c", HOLDER, str(lease_dir), "1" if explicit else "0", str(count), indices]
        argv += [command, str(port_start)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def result(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "holder exited without leasing"
        return json.loads(line)

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)

    @property
    def pid(self) -> int:
        return self.proc.pid


@pytest.fixture
def lease_dir(tmp_path: Path) -> Path:
    return tmp_path / "leases"


@pytest.fixture
def holders():
    started: list[Holder] = []
    yield started
    for h in started:
        if h.proc.poll() is None:
            h.proc.kill()
            h.proc.wait()


def test_two_concurrent_runs_get_disjoint_gpus_and_distinct_ports(lease_dir, holders):
    a = Holder(lease_dir, "0,1,2,3", explicit=False, count=2)
    b = Holder(lease_dir, "0,1,2,3", explicit=False, count=2)
    holders += [a, b]
    ra, rb = a.result(), b.result()
    assert len(ra["gpus"]) == len(rb["gpus"]) == 2
    assert set(ra["gpus"]).isdisjoint(rb["gpus"]) and set(ra["gpus"]) | set(rb["gpus"]) == {0, 1, 2, 3}
    assert ra["port"] != rb["port"] and not {ra["port"], rb["port"]} & {0}
    # a third run finds nothing free and says who holds the GPUs
    with pytest.raises(PodguardError) as info:
        acquire_gpus(GPUS, 1, explicit=False, lease_dir=lease_dir)
    assert info.value.code == ExitCode.GPUS_BUSY == 75
    assert f"pid {a.pid}" in info.value.message and f"pid {b.pid}" in info.value.message
    assert "0 of 4 free" in info.value.message


def test_overlapping_explicit_gpu_list_is_refused_naming_the_holder(lease_dir, holders):
    h = Holder(lease_dir, "0,1")
    holders.append(h)
    h.result()
    with pytest.raises(PodguardError) as info:
        acquire_gpus([GPUS[1], GPUS[2]], explicit=True, lease_dir=lease_dir)
    msg = info.value.message
    assert info.value.code == 75
    assert f"GPU 1 is leased by pid {h.pid} (podguard train -- python a.py) since " in msg
    assert "GPU 2" not in msg and "--wait-for-gpus" in msg
    # nothing half-taken: GPU 2 is still free for someone else
    with acquire_gpus([GPUS[2]], explicit=True, lease_dir=lease_dir) as lease:
        assert lease.indices == (2,)


def test_overlap_is_waited_for_then_acquired_when_the_holder_releases(lease_dir, holders):
    h = Holder(lease_dir, "0,1")
    holders.append(h)
    h.result()
    timer = threading.Timer(0.4, h.release)
    timer.start()
    t0 = time.monotonic()
    try:
        with console.captured() as messages:
            lease = acquire_gpus([GPUS[1], GPUS[2]], explicit=True, wait=True, timeout_s=15, lease_dir=lease_dir)
    finally:
        timer.join()
    with lease:
        assert lease.indices == (1, 2) and time.monotonic() - t0 >= 0.3
    assert messages and f"pid {h.pid}" in messages[0] and "waiting for GPUs" in messages[0]


def test_wait_deadline_passes_with_exit_75(lease_dir, holders):
    h = Holder(lease_dir, "3")
    holders.append(h)
    h.result()
    t0 = time.monotonic()
    with pytest.raises(PodguardError) as info:
        acquire_gpus([GPUS[3]], explicit=True, wait=True, timeout_s=0.3, lease_dir=lease_dir)
    assert info.value.code == 75 and "still busy after waiting" in info.value.message
    assert 0.3 <= time.monotonic() - t0 < 3


def test_sigkilled_holder_frees_its_gpus_and_port_at_once(lease_dir, holders):
    h = Holder(lease_dir, "0,1", port_start=29700)
    holders.append(h)
    port = h.result()["port"]
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait(timeout=10)
    with acquire_gpus(GPUS[:2], explicit=True, lease_dir=lease_dir) as lease:  # no wait needed
        assert lease.indices == (0, 1)
    with allocate_master_port(port, lease_dir=lease_dir) as p:
        assert p.port == port


def test_lease_fds_are_not_inherited_by_children(lease_dir):
    with acquire_gpus(GPUS[:2], explicit=True, lease_dir=lease_dir) as lease:
        code = "import os; print('\\n'.join(os.readlink(f'/proc/self/fd/{f}') for f in os.listdir('/proc/self/fd')))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        assert all(str(p) not in out for p in lease.paths)
        assert {p.name for p in lease.paths} == {f"{g.uuid}.lock" for g in GPUS[:2]}


def test_release_clears_the_record_and_frees(lease_dir):
    lease = acquire_gpus(GPUS, 2, explicit=False, lease_dir=lease_dir, command="run A")
    assert lease.indices == (0, 1)
    held = current_gpu_leases(lease_dir)
    assert set(held) == {GPUS[0].uuid, GPUS[1].uuid}
    holder = held[GPUS[0].uuid]
    assert holder is not None and holder.pid == os.getpid() and holder.command == "run A"
    with acquire_gpus(GPUS, 2, explicit=False, lease_dir=lease_dir) as other:  # same process, other run
        assert other.indices == (2, 3)
    lease.release()
    lease.release()  # idempotent
    assert current_gpu_leases(lease_dir) == {}
    assert all(p.read_text() == "" for p in lease.paths)


def test_counts_and_restrict(lease_dir):
    with pytest.raises(PodguardError) as info:
        acquire_gpus(GPUS, 5, explicit=False, lease_dir=lease_dir)
    assert info.value.code == ExitCode.GPUS_MISSING
    with pytest.raises(UsageError):
        acquire_gpus(GPUS[:2], 3, explicit=True, lease_dir=lease_dir)
    assert acquire_gpus((), 0, explicit=False, lease_dir=lease_dir).gpus == ()  # CPU-only run
    sel = Selection(gpus=GPUS, source="all", inventory_count=4)
    with acquire_gpus(GPUS, 2, explicit=False, lease_dir=lease_dir) as lease:
        assert lease.restrict(sel).indices == (0, 1) and lease.restrict(sel).source == "all"


def free_run(n: int, start: int = 30500) -> int:
    """A port p with p..p+n-1 all free right now."""
    p = start
    while p < 60000:
        if not any(port_in_use(q) for q in range(p, p + n)):
            return p
        p += n
    raise RuntimeError("no free port range")


def test_port_with_a_real_listener_is_skipped(lease_dir):
    base = free_run(3)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", base))
        listener.listen()
        assert port_in_use(base)
        with allocate_master_port(start=base, lease_dir=lease_dir) as lease:
            assert lease.port == base + 1 and lease.env() == {"MASTER_PORT": str(base + 1)}
            with allocate_master_port(start=base, lease_dir=lease_dir) as second:  # leased, so skipped too
                assert second.port == base + 2
        # an explicit MASTER_PORT that something listens on: a clear usage error naming it
        with pytest.raises(UsageError) as info:
            allocate_master_port(base, lease_dir=lease_dir)
        assert f"MASTER_PORT={base} is in use" in info.value.message and "unset MASTER_PORT" in info.value.message


def test_explicit_port_honoured_when_free_refused_when_leased(lease_dir):
    port = free_run(1, 31500)
    with allocate_master_port(port, lease_dir=lease_dir, command="podguard train -- python b.py") as lease:
        assert lease.port == port
        with pytest.raises(UsageError) as info:
            allocate_master_port(port, lease_dir=lease_dir)
        assert info.value.code == 64
        assert (
            f"MASTER_PORT={port} is leased by pid {os.getpid()} (podguard train -- python b.py)" in info.value.message
        )
    with allocate_master_port(port, lease_dir=lease_dir) as again:
        assert again.port == port


@pytest.mark.parametrize(("raw", "ok"), [("29501", 29501), ("", None), ("0", "MASTER_PORT=0"), ("x", "'x'")])
def test_master_port_from_env(raw, ok):
    if isinstance(ok, str):
        with pytest.raises(UsageError, match=ok):
            master_port_from_env({"MASTER_PORT": raw})
    else:
        assert master_port_from_env({"MASTER_PORT": raw}) == ok


def test_default_lease_dir_is_in_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    with acquire_gpus(GPUS[:1], explicit=True) as lease:
        assert lease.paths[0].parent == tmp_path / "state" / "leases" / "gpus"

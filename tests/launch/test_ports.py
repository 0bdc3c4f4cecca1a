"""MASTER_PORT: parsing user input, and leases that keep concurrent runs on one host apart (real flocks).

The lease races between processes are covered in tests/preflight/test_leases.py (GPU and port leases
held together by stand-in runs); these are the port module's own rules.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loopback import free_port
from podguard import state as locks
from podguard.errors import UsageError
from podguard.launch.ports import allocate_master_port, parse_port


@pytest.mark.parametrize(
    ("raw", "needle"),
    [("0", "MASTER_PORT=0 is out of range"), ("65536", "65536"), ("80a", "'80a' is not a whole number"),
     (True, "True"), (" ", "' '")],
)  # fmt: skip
def test_bad_ports_are_usage_errors_naming_the_value(raw, needle):
    with pytest.raises(UsageError) as info:
        parse_port(raw)
    assert needle in info.value.message and info.value.code == 64 and "\n" not in info.value.message
    assert parse_port(" 29500 ") == 29500 and parse_port(1, "--master-port") == 1


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from podguard.launch.ports import allocate_master_port
    lease = allocate_master_port(int(sys.argv[1]), lease_dir=Path(sys.argv[2]))  # its argv describes it
    print("held", flush=True)
    sys.stdin.read()
    """
)


def test_a_port_leased_by_another_run_is_refused_naming_it_without_its_secrets(tmp_path: Path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(port), str(tmp_path), "--hf_token", "hf_" + "a" * 34],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(UsageError) as info:
            allocate_master_port(port, lease_dir=tmp_path)
        message = info.value.message
        assert f"MASTER_PORT={port} is leased by pid {proc.pid}" in message and "unset MASTER_PORT" in message
        assert "hf_aaaa" not in message and "***" in message
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
    with allocate_master_port(port, lease_dir=tmp_path) as lease:  # free again once the holder exited
        assert lease.held and lease.env() == {"MASTER_PORT": str(port)}
    assert not lease.held


def test_default_lease_folder_is_per_host_in_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    with allocate_master_port(start=free_port()) as lease:
        assert lease.path is not None
        assert lease.path.parent.parent == tmp_path / "state" / "leases"
        assert lease.path.parent.name == f"ports-{locks.host_id()}"


def test_a_state_dir_without_flock_leases_in_a_host_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(locks, "flock_supported", lambda directory: False)  # as on an NFS volume without locks
    local = tmp_path / "local"
    monkeypatch.setattr(locks, "local_lock_dir", lambda area: local / area)
    with allocate_master_port(start=free_port()) as lease:
        assert lease.path is not None and lease.path.is_relative_to(local / "leases")


def test_runs_with_different_state_dirs_on_one_host_never_share_a_port(tmp_path: Path, monkeypatch):
    """A sweep per PODGUARD_STATE_DIR: before either run binds its port, the second must not pick the first's
    (seen: two demos on 29500, EADDRINUSE in the later one's rendezvous)."""
    monkeypatch.setattr(locks, "local_lock_dir", lambda area: tmp_path / "host" / area)
    start = free_port()
    monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "sweep-a"))
    with allocate_master_port(start=start) as first:
        monkeypatch.setenv("PODGUARD_STATE_DIR", str(tmp_path / "sweep-b"))
        with allocate_master_port(start=start) as second:
            assert second.port != first.port
        with pytest.raises(UsageError) as taken:  # the first's port asked for by name: leased, named
            allocate_master_port(first.port)
        assert f"MASTER_PORT={first.port} is leased by pid " in taken.value.message
    with allocate_master_port(start=start) as again:  # released with the first run
        assert again.port == first.port

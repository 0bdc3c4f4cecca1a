"""The /proc snapshot: real processes holding stand-in NVIDIA device files in a temp dev dir.

This module also holds the small process helpers (`Spawner`) that `test_holders.py` and
`test_cleanup.py` import: real processes, real fds, real signals, and a finalizer that kills every
process a test started (by pid, after checking its start time) even when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from podguard.preflight.cleanup.devices import find_device_files, gpu_minor, resolve_dev_dir
from podguard.preflight.cleanup.names import names_of
from podguard.preflight.cleanup.process_table import read_stat, scan_processes
from procspawn import DEVICES, HOLDER_SRC, PY, Spawner, alive, synthetic, wait_until


def test_scan_sees_holder_devices_tree_and_identity(spawner: Spawner) -> None:
    pid, kids = spawner.holder("nvidia0", "nvidiactl", "nvidia-uvm", fork=2)
    table = scan_processes(spawner.dev)
    p = table.get(pid)
    assert p is not None
    assert p.devices == ("nvidia-uvm", "nvidia0", "nvidiactl")
    assert p.gpu_minors == (0,)
    assert p.ppid == os.getpid()
    assert p.cmdline[:3] == (PY, "-S", "-c") and p.uid == os.geteuid()
    assert p.inspected and not p.zombie and p.start_time > 0
    for kid in kids:  # forked children inherit the fds: the evidence NVML does not give
        child = table.get(kid)
        assert child is not None and child.devices == p.devices and child.ppid == pid
    assert set(table.descendants(pid)) == set(kids)
    assert table.children(pid) == tuple(sorted(kids))
    assert set(table.holders_of_minor(0)) == {pid, *kids}
    me = table.get(os.getpid())
    assert me is not None and me.devices == ()
    chain = table.ancestors(pid)
    assert chain[0] == os.getpid() and chain[-1] == 1


def test_monitor_with_only_nvidiactl_holds_no_gpu(spawner: Spawner) -> None:
    pid, _ = spawner.holder("nvidiactl")
    p = scan_processes(spawner.dev).get(pid)
    assert p is not None and p.devices == ("nvidiactl",) and p.gpu_minors == ()


def test_same_device_under_another_path_matches_by_inode(spawner: Spawner, tmp_path: Path) -> None:
    elsewhere = tmp_path / "mnt"
    elsewhere.mkdir()
    os.link(spawner.dev / "nvidia1", elsewhere / "nvidia-gpu-1")  # same inode, other name and dir
    proc = subprocess.Popen(
        [PY, "-S", "-c", HOLDER_SRC, json.dumps({"open": [str(elsewhere / "nvidia-gpu-1")]})],
        stdout=subprocess.PIPE,
    )
    spawner._popens.append(proc)
    spawner.track(proc.pid)
    pid = spawner._ready(proc)["pid"]
    p = scan_processes(spawner.dev).get(pid)
    assert p is not None and p.devices == ("nvidia1",)


def test_dev_dir_given_through_a_symlink_still_matches(spawner: Spawner, tmp_path: Path) -> None:
    link = tmp_path / "devlink"
    link.symlink_to(spawner.dev)
    pid, _ = spawner.holder("nvidia2")
    p = scan_processes(link).get(pid)
    assert p is not None and p.devices == ("nvidia2",)


def test_dev_dir_from_environment(monkeypatch: pytest.MonkeyPatch, spawner: Spawner) -> None:
    monkeypatch.setenv("PODGUARD_DEV_DIR", str(spawner.dev))
    assert resolve_dev_dir() == spawner.dev
    assert resolve_dev_dir("/elsewhere") == Path("/elsewhere")
    monkeypatch.delenv("PODGUARD_DEV_DIR")
    assert resolve_dev_dir() == Path("/dev")
    devs = find_device_files(spawner.dev)
    assert set(devs.names) == set(DEVICES)
    assert find_device_files(spawner.root / "missing").names == ()


def test_gpu_minor_parsing() -> None:
    assert gpu_minor("nvidia0") == 0 and gpu_minor("nvidia12") == 12
    assert gpu_minor("nvidiactl") is None and gpu_minor("nvidia-uvm") is None
    assert gpu_minor("nvidia-caps/nvidia-cap1") is None


@pytest.mark.parametrize(
    ("comm", "argv", "expected"),
    [
        ("python3", ["python3", "-u", "-m", "torch.distributed.run", "--nproc-per-node=8", "t.py"],
         {"python3", "torch.distributed.run"}),
        ("jupyter-lab", ["/usr/bin/python3", "/usr/local/bin/jupyter-lab", "--ip=0.0.0.0"],
         {"python3", "jupyter-lab"}),
        ("bash", ["-bash"], {"bash"}),
        ("python3", ["/usr/bin/env", "PYTHONUNBUFFERED=1", "python3", "-X", "dev", "train.py"],
         {"env", "python3", "train.py"}),
        ("sshd", ["sleep", "100"], {"sshd", "sleep"}),
        ("python", ["python", "-c", "import x"], {"python"}),
        ("python", ["python", "-mdeepspeed.launcher.launch"], {"python", "deepspeed.launcher.launch"}),
    ],
)  # fmt: skip
def test_names_look_through_interpreters(comm: str, argv: list[str], expected: set[str]) -> None:
    assert names_of(comm, tuple(argv)) == expected


def test_renamed_processes_are_seen_by_comm_and_argv0(spawner: Spawner) -> None:
    by_prctl, _ = spawner.holder("nvidia0", comm="sshd")
    by_argv0, _ = spawner.holder("nvidia0", argv0="jupyter-lab")
    table = scan_processes(spawner.dev)
    a, b = table.get(by_prctl), table.get(by_argv0)
    assert a is not None and a.comm == "sshd" and "sshd" in a.names
    assert b is not None and b.cmdline[0] == "jupyter-lab" and "jupyter-lab" in b.names


def test_shell_kinds() -> None:
    assert synthetic(10, 1, ["-bash"]).interactive_shell
    assert synthetic(10, 1, ["bash", "-l"]).interactive_shell
    assert not synthetic(10, 1, ["bash", "-c", "x"]).interactive_shell
    assert not synthetic(10, 1, ["/bin/sh", "run.sh"]).interactive_shell
    assert synthetic(10, 1, ["/bin/sh", "run.sh"]).is_shell
    assert not synthetic(10, 1, ["python3", "x.py"]).is_shell


def test_read_stat_tracks_identity(spawner: Spawner) -> None:
    pid = spawner.plain(["sleep", "30"])
    st = read_stat(pid)
    assert st is not None and st.ppid == os.getpid() and st.comm == "sleep"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), what="sleep to die")
    st2 = read_stat(pid)
    assert st2 is None or st2.state == "Z"
    assert read_stat(2**22 + 12345) is None


def test_fd_scan_skipped_when_asked(spawner: Spawner) -> None:
    pid, _ = spawner.holder("nvidia0")
    p = scan_processes(spawner.dev, fds=False).get(pid)
    assert p is not None and p.devices == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a scan as another user")
def test_unreadable_fds_are_recorded_not_guessed(spawner: Spawner) -> None:
    import tempfile

    # The dev dir must be visible to the unprivileged scanner (pytest's tmp dirs are private).
    public = Path(tempfile.mkdtemp(prefix="podguard-dev-"))
    public.chmod(0o755)
    (public / "nvidia0").write_bytes(b"")
    proc = subprocess.Popen(
        [PY, "-S", "-c", HOLDER_SRC, json.dumps({"open": [str(public / "nvidia0")]})], stdout=subprocess.PIPE
    )
    spawner._popens.append(proc)
    spawner.track(proc.pid)
    pid = spawner._ready(proc)["pid"]
    code = (  # import first: the interpreter's own files may not be readable by nobody
        "import json, os, sys; sys.path[:0] = json.loads(sys.argv[2]); "
        "from podguard.preflight.cleanup.process_table import scan_processes; "
        "os.setgid(65534); os.setuid(65534); "
        "p = scan_processes(sys.argv[1]).get(int(sys.argv[3])); "
        "print(json.dumps([p.fd_error, list(p.devices)]))"
    )
    import podguard

    pkg_root = str(Path(podguard.__file__).resolve().parent.parent)
    try:
        out = subprocess.run(
            [PY, "-S", "-c", code, str(public), json.dumps([pkg_root]), str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        (public / "nvidia0").unlink()
        public.rmdir()
    if out.returncode != 0:
        pytest.skip(f"cannot run as nobody here: {out.stderr.strip()[-200:]}")
    fd_error, devices = json.loads(out.stdout)
    assert fd_error == "EACCES" and devices == []


def test_scan_of_many_processes_is_fast(spawner: Spawner) -> None:
    """A smoke figure, not a benchmark: 200 extra processes with device files open."""
    spawner.holder("nvidia0", "nvidiactl", fork=200)
    table = scan_processes(spawner.dev)
    assert len(table.holders_of_minor(0)) == 201
    assert table.scan_ms < 1000  # measured ~10-25 ms here; the bound only catches pathologies

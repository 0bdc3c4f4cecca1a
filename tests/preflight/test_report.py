"""The preflight report file: atomic writes, latest.json, a bounded folder."""

from __future__ import annotations


def test_reports_are_pruned_to_the_newest(tmp_path, monkeypatch):
    from podguard.preflight import report

    monkeypatch.setattr(report, "KEEP_REPORTS", 3)
    paths = []
    for i in range(5):
        monkeypatch.setattr(report.time, "strftime", lambda fmt, t=None, i=i: f"2026010{i}T000000")
        paths.append(report.write_report(tmp_path, "health", {"n": i}))
    left = sorted(p.name for p in (tmp_path / "reports").glob("2026*.json"))
    assert left == [p.name for p in paths[-3:]]
    assert (tmp_path / "reports" / "latest.json").exists()


# ---- Issue 7 items 8 and 13: best-effort reports on a full volume; no secret and nothing world-readable ----

import json  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from fakenvml import pid_alive  # noqa: E402

PODGUARD = [sys.executable, "-m", "podguard"]
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"

# A state dir on a tiny tmpfs that is full: mounted in a private mount namespace (unshare), so it needs
# no privilege and disappears with the command.
FULL_VOLUME = """
set -e
mount -t tmpfs -o size=64k,nr_inodes=64 tmpfs "$STATE"
mkdir "$STATE/reports"
dd if=/dev/zero of="$STATE/fill" bs=4k 2>/dev/null || true
set +e
"$@"
code=$?
echo "left: $(ls -A "$STATE/reports" | tr '\\n' ' ')" >&2
exit $code
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -Urm` (user + mount namespaces)")
def test_a_full_state_volume_costs_the_record_not_the_verdict(cli_node, tmp_path: Path) -> None:
    state = tmp_path / "full"
    state.mkdir()
    env = {**cli_node.env, "STATE": str(state), "PODGUARD_STATE_DIR": str(state)}
    proc = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", FULL_VOLUME, "sh", *PODGUARD, "health"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr  # the verdict (PASS), not a crash
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("could not write the report") == 1
    left = proc.stderr.rsplit("left:", 1)[1].split()
    assert not [name for name in left if name.endswith(".tmp")], f"temporary files left behind: {left}"


def test_reports_are_owner_only_and_killed_command_lines_are_redacted(cli_node, tmp_path: Path) -> None:
    paths = [str(cli_node.dev_dir / "nvidiactl"), str(cli_node.dev_dir / "nvidia0")]
    script = tmp_path / "train.py"  # holds GPU 0's device file; a secret in its argv
    script.write_text(
        f"import os, signal\nfds = [os.open(p, os.O_RDONLY) for p in {paths!r}]\nprint('ready', flush=True)\n"
        "while True:\n    signal.pause()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-S", str(script), "--hf_token", TOKEN, f"--api-key={TOKEN}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline()
        cli_node.register(holder.pid, 0, 2048)
        proc = subprocess.run(
            [*PODGUARD, "cleanup", "--gpu-list", "0"], env=cli_node.env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert not pid_alive(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    reports = tmp_path / "state" / "reports"
    text = (reports / "latest.json").read_text()
    killed = json.loads(text)["cleanup"]["killed"]
    assert [k["pid"] for k in killed] == [holder.pid] and "--hf_token ***" in killed[0]["cmdline"]
    assert TOKEN not in text and TOKEN not in proc.stderr
    for path in reports.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

"""RunPod's SSH convention, for real: PUBLIC_KEY starts sshd, a real SSH client (paramiko) logs in with that
key and runs commands, and SSH sessions see the pod's environment through /etc/rp_environment."""

from __future__ import annotations

import time

import paramiko
import pytest
from imagetools import docker, wait_for, wait_for_log

pytestmark = [pytest.mark.docker, pytest.mark.slow]

POD_ENV = {
    "RUNPOD_POD_ID": "x7k2m9q4w1e3r5",
    "RUNPOD_API_KEY": "rpa_TESTKEY0123456789abcdefghij",
    "WANDB_PROJECT": 'it\'s "quoted" $HOME `x` \\ end',
}


def _key() -> tuple[paramiko.PKey, str]:
    key = paramiko.ECDSAKey.generate(bits=256)
    return key, f"{key.get_name()} {key.get_base64()} podguard-test"


def _connect(port: int, key: paramiko.PKey) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # a fresh container: its host key is new
    client.connect("127.0.0.1", port, username="root", pkey=key, look_for_keys=False, allow_agent=False, timeout=10)
    return client


def _run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, stderr = client.exec_command(command, timeout=30)
    out = stdout.read().decode() + stderr.read().decode()
    return stdout.channel.recv_exit_status(), out


def _login_shell(client: paramiko.SSHClient, command: str) -> str:
    """What an interactive login (a person typing `ssh root@host`) prints for `command`."""
    shell = client.invoke_shell()
    shell.send(f"{command}; exit\n".encode())
    out = b""
    deadline = time.monotonic() + 20
    while not shell.exit_status_ready() and time.monotonic() < deadline:
        if shell.recv_ready():
            out += shell.recv(65536)
        else:
            time.sleep(0.05)
    while shell.recv_ready():
        out += shell.recv(65536)
    return out.decode(errors="replace")


def test_public_key_starts_sshd_and_sessions_see_the_pod_env(any_container) -> None:
    key, public = _key()
    other, other_public = _key()
    env = {**POD_ENV, "PUBLIC_KEY": f"{public}\n{other_public}\n"}  # RunPod passes several keys, one per line
    opts = ["-p", "127.0.0.1::22"]
    for name, value in env.items():
        opts += ["-e", f"{name}={value}"]
    cid = any_container("bash", "-c", "echo JOB UP; exec sleep 600", opts=opts)
    wait_for_log(cid, "sshd started")
    port = int(docker("port", cid, "22/tcp", check=True).stdout.split(":")[-1])

    client = wait_for(lambda: _try_connect(port, key), "an SSH login with PUBLIC_KEY", 30, cid)
    code, out = _run(client, 'printf "%s|" "$RUNPOD_POD_ID" "$RUNPOD_API_KEY" "$WANDB_PROJECT"; podguard --version')
    assert code == 0, out
    assert out.startswith("|".join(POD_ENV.values()) + "|podguard "), out
    login = _login_shell(client, 'echo "LOGIN:$RUNPOD_POD_ID:$WANDB_PROJECT:END"')
    assert f"LOGIN:{POD_ENV['RUNPOD_POD_ID']}:{POD_ENV['WANDB_PROJECT']}:END" in login, login
    client.close()

    _connect(port, other).close()  # the second key of PUBLIC_KEY works too
    with pytest.raises(paramiko.AuthenticationException):
        _connect(port, paramiko.ECDSAKey.generate(bits=256))  # sshd checks keys: an unknown key is refused
    # The file holds the API key: root only. The job itself still runs (sshd did not hold it up).
    assert docker("exec", cid, "stat", "-c", "%a %U", "/etc/rp_environment", check=True).stdout.strip() == "600 root"
    assert "JOB UP" in docker("logs", cid).stdout


def _try_connect(port: int, key: paramiko.PKey) -> paramiko.SSHClient | None:
    try:
        return _connect(port, key)
    except (paramiko.SSHException, OSError):
        return None  # sshd is still starting (host keys are made at start)


def test_without_public_key_no_sshd(container) -> None:
    cid = container("bash", "-c", "echo JOB UP; exec sleep 600", opts=["-e", "RUNPOD_POD_ID=abc"])
    wait_for_log(cid, "JOB UP")
    table = docker("exec", cid, "sh", "-c", "cat /proc/[0-9]*/comm", check=True).stdout.split()
    assert "sshd" not in table, table

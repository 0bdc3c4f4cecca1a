"""Roles: job file validation, the GPU split, start order on readiness, timeouts, failing roles."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest

from loopback import free_port
from podguard.errors import UsageError
from podguard.gpu.selected import SelectedGpu, Selection
from podguard.launch.modes import only_for_gpu
from podguard.launch.roles import READY_TIMEOUT_EXIT, load_roles, parse_roles, run_roles

PY = sys.executable


def _selection(n: int = 4) -> Selection:
    gpus = tuple(SelectedGpu(i, f"GPU-{i:08d}", f"GPU-{i:08d}") for i in range(n))
    return Selection(gpus=gpus, source="all", inventory_count=n)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _plan(data: dict, n: int = 4):
    return parse_roles(data, _selection(n), master_port=29500, source="job.toml")


def test_gpu_split_env_and_ports():
    plan = _plan(
        {
            "roles": {
                "server": {"command": ["serve"], "gpus": 1, "ready": {"url": "http://127.0.0.1:30000/health"}},
                "trainer": {
                    "command": "python train.py --x 'a b'",
                    "gpus": "rest",
                    "after": ["server"],
                    "per_gpu": True,
                },
                "judge": {"command": ["judge"], "gpus": [3], "per_gpu": True},
            }
        }
    )
    server, trainer, judge = plan.roles
    assert [g.index for g in server.gpus] == [0] and server.service
    assert [g.index for g in judge.gpus] == [3]  # explicit lists are taken first
    assert [g.index for g in trainer.gpus] == [1, 2] and not trainer.service
    assert trainer.command == ("python", "train.py", "--x", "a b")
    names = [s.name for s in trainer.specs]
    assert names == ["trainer.0", "trainer.1"]
    assert [s.prefix for s in trainer.specs] == ["trainer:GPU1:", "trainer:GPU2:"]
    assert trainer.specs[1].env["CUDA_VISIBLE_DEVICES"] == "GPU-00000002"
    assert trainer.specs[1].env["RANK"] == "1" and trainer.specs[1].env["WORLD_SIZE"] == "2"
    assert server.specs[0].env["CUDA_VISIBLE_DEVICES"] == "GPU-00000000"
    assert {trainer.specs[0].env["MASTER_PORT"], judge.specs[0].env["MASTER_PORT"]} == {"29500", "29501"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "[roles.a]\ncommand = ['x']\nafter = ['b']\n",
            r"roles.a.after = \['b'\] names unknown role 'b'; roles are: a",
        ),
        (
            "[roles.a]\ncommand = ['x']\nafter = ['b']\n[roles.b]\ncommand = ['x']\nafter = ['a']\n",
            "'after' forms a cycle: a -> b -> a",
        ),
        ("[roles.a]\ncommand = ['x']\nafter = ['a']\n", "cycle: a -> a"),
        (
            "[roles.a]\ncommand = ['x']\ngpus = 3\n[roles.b]\ncommand = ['x']\ngpus = 2\n",
            r"roles ask for 5 GPU\(s\) \(a 3, b 2\) but 4 are selected",
        ),
        ("[roles.a]\ncommand = ['x']\ngpus = 'all'\n", "roles.a.gpus = 'all' is not valid; expected a whole number"),
        ("[roles.a]\ncommand = ['x']\ngpus = [7]\n", r"GPU 7 is not selected \(selected: 0, 1, 2, 3\)"),
        ("[roles.a]\ncommand = ['x']\ngpus = 'rest'\n[roles.b]\ncommand = ['x']\ngpus = 'rest'\n", "only one role"),
        ("[roles.a]\ncommand = ['x']\ngpus = 4\n[roles.b]\ncommand = ['x']\ngpus = 'rest'\n", "gets no GPU"),
        ("[roles.a]\ncommand = 5\n", "roles.a.command = 5 is not valid; expected a list of strings"),
        ("[roles.a]\ngpus = 1\n", "roles.a.command is missing"),
        ("[roles.a]\ncommand = ['x']\ngpu = 1\n", "roles.a.gpu is not a known key; valid keys: after, command"),
        ("[roles.a]\ncommand = ['x']\nready = {log = '('}\n", "not a valid regular expression"),
        ("[roles.a]\ncommand = ['x']\nready = {url = 'localhost:80'}\n", "expected an http:// or https:// URL"),
        ("[roles.a]\ncommand = ['x']\nready = {log = 'x', url = 'http://a'}\n", "exactly one of"),
        ("[roles.a]\ncommand = ['x']\nready = {log = 'x', timeout = -1}\n", "expected a number of seconds > 0"),
        ("[roles.a]\ncommand = ['x']\nper_gpu = 'yes'\n", "expected true or false"),
        ("[roles.a]\ncommand = ['x']\nenv = {A = 1}\n", "expected a table of strings"),
        ("[roles.a]\ncommand = ['x']\nprefix = '{host}'\n", r"unknown field \{host\}"),
        ("[job]\nready_timeout = 'soon'\n[roles.a]\ncommand = ['x']\n", "job.ready_timeout = 'soon'"),
        ("[jobs]\n[roles.a]\ncommand = ['x']\n", "jobs is not a known key; valid keys: job, roles"),
        ("[job]\n", "roles are missing"),
        ("[roles.'bad name']\ncommand = ['x']\n", "not a valid role name"),
        ("[roles.a\ncommand = ['x']\n", "is not valid TOML"),
    ],
)
def test_bad_job_files_are_usage_errors(tmp_path: Path, text: str, match: str):
    with pytest.raises(UsageError, match=match) as info:
        load_roles(_write(tmp_path, text), _selection(), master_port=29500)
    assert "\n" not in info.value.message
    assert info.value.code == 64


def test_missing_job_file_and_cpu_only_node(tmp_path: Path):
    with pytest.raises(UsageError, match="does not exist"):
        load_roles(tmp_path / "nope.toml", _selection(), master_port=1)
    cpu = Selection(gpus=(), source="none", inventory_count=0)
    with pytest.raises(UsageError, match=r"but 0 are selected \(none \(CPU only\)\)"):
        parse_roles({"roles": {"a": {"command": ["x"], "gpus": 1}}}, cpu, master_port=1)
    plan = parse_roles(
        {"roles": {"a": {"command": ["x"], "gpus": "rest", "per_gpu": True, "nproc": 2}}}, cpu, master_port=1
    )
    assert [s.prefix for s in plan.roles[0].specs] == ["a:CPU0:", "a:CPU1:"]


_SERVER = (
    "import time; print('loading', flush=True); time.sleep(0.3); print('Uvicorn running', flush=True); time.sleep(30)"
)


def test_trainers_start_once_the_server_printed_its_ready_line(tmp_path: Path):
    marker = tmp_path / "server-ready"
    server = _SERVER.replace("print('Uvicorn", f"open({str(marker)!r}, 'w').close(); print('Uvicorn")
    trainer = f"import os, sys; sys.exit(0 if os.path.exists({str(marker)!r}) else 9)"
    job = _write(
        tmp_path,
        f"""
[roles.server]
command = [{PY!r}, "-c", {server!r}]
gpus = 1
ready = {{ log = "Uvicorn running" }}

[roles.trainer]
command = [{PY!r}, "-c", {trainer!r}]
gpus = "rest"
after = ["server"]
per_gpu = true
""",
    )
    out = io.BytesIO()
    outcome = run_roles(job, _selection(3), master_port=29500, grace_s=2, terminal=out, log_dir=tmp_path / "logs")
    text = out.getvalue().decode()
    assert outcome.exit_code == 0, text
    assert "role server is ready (printed /Uvicorn running/" in text
    assert text.index("role server is ready") < text.index("starting role trainer")
    assert "stopping service(s) server" in text
    server_exit = next(w for w in outcome.workers if w.name == "server")
    assert server_exit.stopped_by_podguard
    assert (tmp_path / "logs" / "server.log").read_text() == "loading\nUvicorn running\n"
    assert {w.name for w in outcome.workers} == {"server", "trainer.0", "trainer.1"}


def test_server_that_never_becomes_ready_times_out(tmp_path: Path):
    job = _write(
        tmp_path,
        f"""
[roles.server]
command = [{PY!r}, "-c", "import time; print('still loading', flush=True); time.sleep(30)"]
ready = {{ log = "Uvicorn running", timeout = 0.5 }}

[roles.trainer]
command = ["true"]
after = ["server"]
""",
    )
    out = io.BytesIO()
    t0 = time.monotonic()
    outcome = run_roles(job, _selection(), master_port=29500, grace_s=1, terminal=out)
    assert outcome.exit_code == READY_TIMEOUT_EXIT
    assert time.monotonic() - t0 < 5
    assert "role server was not ready after 0.5 s (waiting for log line /Uvicorn running/)" in outcome.detail
    assert outcome.root_cause is not None and outcome.root_cause.tail == ("still loading",)
    assert [w.name for w in outcome.workers] == ["server"]  # the trainer never started


def test_server_role_that_dies_fails_the_job(tmp_path: Path):
    job = _write(
        tmp_path,
        f"""
[roles.server]
command = [{PY!r}, "-c", "import sys; print('CUDA out of memory', flush=True); sys.exit(7)"]
ready = {{ log = "Uvicorn running" }}

[roles.trainer]
command = ["true"]
after = ["server"]
""",
    )
    outcome = run_roles(job, _selection(), master_port=29500, grace_s=1, terminal=io.BytesIO())
    assert outcome.exit_code == 7
    assert outcome.root_cause is not None and outcome.root_cause.name == "server"
    assert outcome.root_cause.tail == ("CUDA out of memory",)


def test_failing_trainer_stops_the_server(tmp_path: Path):
    job = _write(
        tmp_path,
        f"""
[roles.server]
command = [{PY!r}, "-c", {_SERVER!r}]
ready = {{ log = "Uvicorn running" }}

[roles.trainer]
command = [{PY!r}, "-c", "import sys; sys.exit(3)"]
after = ["server"]
per_gpu = true
gpus = 2
""",
    )
    outcome = run_roles(job, _selection(), master_port=29500, grace_s=1, terminal=io.BytesIO())
    assert outcome.exit_code == 3
    assert outcome.root_cause is not None and outcome.root_cause.name.startswith("trainer.")
    assert next(w for w in outcome.workers if w.name == "server").stopped_by_podguard


def test_ready_by_health_url(tmp_path: Path):
    port = free_port()
    (tmp_path / "health").write_text("ok")
    job = _write(
        tmp_path,
        f"""
[job]
ready_timeout = 20

[roles.server]
command = [{PY!r}, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", {str(tmp_path)!r}]
ready = {{ url = "http://127.0.0.1:{port}/health" }}

[roles.client]
command = [{PY!r}, "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/health').read())"]
after = ["server"]
""",
    )
    out = io.BytesIO()
    outcome = run_roles(job, _selection(), master_port=29500, grace_s=2, terminal=out)
    text = out.getvalue().decode()
    assert outcome.exit_code == 0, text
    assert "role server is ready (answered" in text and "client:b'ok'" in text


def test_only_gpu_for_roles_and_plan_specs():
    plan = _plan(
        {"roles": {"a": {"command": ["x"], "gpus": 1}, "b": {"command": ["y"], "gpus": "rest", "per_gpu": True}}}
    )
    assert [s.name for s in plan.specs()] == ["a", "b.0", "b.1", "b.2"]
    assert only_for_gpu(plan.specs(), 0) == {"a"} and only_for_gpu(plan.specs(), 2) == {"b.1"}

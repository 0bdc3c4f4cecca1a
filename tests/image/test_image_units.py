"""The image tooling's pure parts, without an engine: `--gpus` values and who holds which GPU, pod spec
reading, tags and labels, the build context, the image's Python, `--torch base`'s checks of the base, log
timelines, and the rule that nothing but the image commands imports the Docker SDK."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from imagetools import ROOT

from podguard.errors import UsageError
from podguard.image.basetorch import BaseTorch, parse_probe, require_base_torch
from podguard.image.build import plan_build, split_reference
from podguard.image.context import BuildContext
from podguard.image.gpus import GpuSet, holdings, parse_gpus
from podguard.image.podspec import LocalPodSpec, parse_port, read_pod_spec
from podguard.image.run import container_name, public_keys, resolve_env
from podguard.image.source import SourceMetadata, default_base, public_url
from podguard.image.timeline import Timeline
from podguard.image.wheelhouse import python_from_probe

# -- --gpus and holdings ---------------------------------------------------------------------------


def test_parse_gpus_forms() -> None:
    assert parse_gpus("all").everything
    assert parse_gpus("none").empty
    assert parse_gpus("2") == GpuSet(ids=frozenset({"0", "1"}), count=2)  # a count, as `docker run --gpus 2`
    assert parse_gpus("1,3").ids == {"1", "3"} and parse_gpus("1,3").count is None
    assert parse_gpus("device=2").ids == {"2"}
    assert parse_gpus("GPU-8f3c0d2e-1111-2222-3333-444455556666").ids == {"GPU-8f3c0d2e-1111-2222-3333-444455556666"}


@pytest.mark.parametrize(("raw", "named"), [("0", "device=0"), ("x1", "'x1'"), ("", "expected all"), ("1,,z", "'z'")])
def test_parse_gpus_rejects_with_one_line(raw: str, named: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_gpus(raw)
    assert named in err.value.message and "\n" not in err.value.message


def test_overlaps() -> None:
    gpu0, gpu1 = parse_gpus("device=0"), parse_gpus("device=1")
    assert not gpu0.overlaps(gpu1)
    assert parse_gpus("2").overlaps(gpu1)  # the first two GPUs include GPU 1
    assert parse_gpus("all").overlaps(gpu1)
    assert not parse_gpus("none").overlaps(parse_gpus("all"))
    # An index and a UUID cannot be compared without the driver: reported as a possible holder.
    assert gpu0.overlaps(parse_gpus("GPU-aaaa"))
    assert not parse_gpus("GPU-aaaa").overlaps(parse_gpus("GPU-bbbb"))


def _attrs(requests=None, runtime="runc", env=()) -> dict:  # type: ignore[no-untyped-def]
    return {"HostConfig": {"DeviceRequests": requests, "Runtime": runtime}, "Config": {"Env": list(env)}}


def test_holdings_from_inspect_data() -> None:
    gpu_caps = [["gpu"]]
    assert holdings(_attrs([{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": gpu_caps}])).everything
    assert holdings(_attrs([{"Driver": "", "Count": 2, "DeviceIDs": [], "Capabilities": gpu_caps}])).ids == {"0", "1"}
    assert holdings(_attrs([{"Driver": "nvidia", "Count": 0, "DeviceIDs": ["3"], "Capabilities": []}])).ids == {"3"}
    assert holdings(_attrs([{"Driver": "other", "Count": -1, "Capabilities": [["tpu"]]}])).empty
    assert holdings(_attrs(runtime="nvidia", env=["NVIDIA_VISIBLE_DEVICES=1,2"])).ids == {"1", "2"}
    assert holdings(_attrs(runtime="nvidia", env=["NVIDIA_VISIBLE_DEVICES=void"])).empty
    assert holdings(_attrs(runtime="runc", env=["NVIDIA_VISIBLE_DEVICES=all"])).empty  # no NVIDIA runtime: no GPU
    assert holdings(_attrs()).empty


# -- pod spec --------------------------------------------------------------------------------------


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pod.toml"
    path.write_text(text)
    return path


def test_read_pod_spec(tmp_path: Path) -> None:
    spec = read_pod_spec(
        _spec(
            tmp_path,
            'name = "llm"\nimage = "me/podguard:0.2"\nargs = "train -- python train.py --lr \'3e-4\'"\n'
            'ports = ["22/tcp", "8888/http"]\n[gpu]\ntypes = ["NVIDIA H100 80GB HBM3"]\ncount = 8\n'
            '[network_volume]\nid = "v1"\npath = "/data"\n[env]\nA = "1"\nDEBUG = true\nN = 3\n',
        )
    )
    assert spec.command == ("train", "--", "python", "train.py", "--lr", "3e-4")
    assert spec.ports == ("22/tcp", "8888/tcp")
    assert (spec.gpu_count, spec.volume_path) == (8, "/data")
    assert spec.env == {"A": "1", "DEBUG": "true", "N": "3"}
    cpu = read_pod_spec(_spec(tmp_path, 'name = "x"\nimage = "i"\n[cpu]\nid = "cpu3c"\nvcpus = 4\n'))
    assert (cpu.command, cpu.gpu_count, cpu.volume_path, cpu.ports) == (("train",), None, None, ("22/tcp",))


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('name = "x"\nimage = "i"\nimgae = "typo"\n[cpu]\nid = "c"\n', "imgae"),  # the pods parser's check
        ('name = "x"\nimage = "i"\nargs = "train \'unclosed"\n[cpu]\nid = "c"\n', "cannot be split"),
    ],
)
def test_read_pod_spec_rejects_with_one_line(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(UsageError) as err:
        read_pod_spec(_spec(tmp_path, text))
    assert named in err.value.message and "\n" not in err.value.message, err.value.message


def test_ports_and_names() -> None:
    assert parse_port(" 8888/http ") == "8888/tcp"
    for bad in ("70000/tcp", "22", "22/sctp"):
        with pytest.raises(UsageError):
            parse_port(bad)
    spec = LocalPodSpec("my pod/1", "i", (), (), {}, None, None)
    assert container_name(spec) == "my-pod-1"


def test_secret_references_and_public_keys(tmp_path: Path) -> None:
    env, notes = resolve_env(
        {"HF_TOKEN": "{{ RUNPOD_SECRET_hf }}", "X": "{{ RUNPOD_SECRET_missing }}", "PLAIN": "{{ not a ref"},
        {"RUNPOD_SECRET_hf": "hf_value"},
    )
    assert env == {"HF_TOKEN": "hf_value", "PLAIN": "{{ not a ref"}
    assert len(notes) == 1 and "RUNPOD_SECRET_missing" in notes[0]
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "a.pub").write_text("ssh-ed25519 AAAA a@x\n")
    (tmp_path / ".ssh" / "b.pub").write_text("\nssh-rsa BBBB b@x\n")
    (tmp_path / ".ssh" / "id_rsa").write_text("PRIVATE")
    assert public_keys(tmp_path) == "ssh-ed25519 AAAA a@x\nssh-rsa BBBB b@x"
    assert public_keys(tmp_path / "nowhere") is None


# -- build: tags, labels, context, base ------------------------------------------------------------


def test_references_and_tags(tmp_path: Path) -> None:
    assert split_reference("registry:5000/me/podguard:dev") == ("registry:5000/me/podguard", "dev")
    assert split_reference("localhost:5000/podguard") == ("localhost:5000/podguard", "latest")
    for bad in ("Podguard:x", "podguard:-x", "podguard:a b", ":x"):
        with pytest.raises(UsageError):
            split_reference(bad)
    meta = SourceMetadata(version="0.2.0", revision="abc123def456-dirty", source="https://example.org/p.git")
    plan = plan_build(tmp_path, base="b:1", tag="me/podguard", meta=meta)
    assert plan.tags == ("me/podguard:latest", "me/podguard:0.2.0", "me/podguard:0.2.0-abc123def456-dirty")
    assert plan.buildargs == {
        "BASE_IMAGE": "b:1",
        "PODGUARD_VERSION": "0.2.0",
        "PODGUARD_REVISION": "abc123def456-dirty",
        "PODGUARD_SOURCE": "https://example.org/p.git",
    }
    unknown = plan_build(tmp_path, base="b", tag="p:x", meta=SourceMetadata("0.2.0", "unknown", ""))
    assert unknown.tags == ("p:x", "p:0.2.0") and "PODGUARD_SOURCE" not in unknown.buildargs


def test_public_url_drops_credentials() -> None:
    assert public_url("https://user:ghp_secret@github.com/me/podguard.git") == "https://github.com/me/podguard.git"
    assert public_url("https://tok@git.example.org:8443/p.git?x=1") == "https://git.example.org:8443/p.git"
    assert public_url("git@github.com:me/podguard.git") == "https://github.com/me/podguard.git"
    assert public_url("/local/path") == ""


def test_default_base_is_the_smallest_cuda_image() -> None:
    base = default_base(ROOT)
    # torch's wheels carry their own CUDA libraries: the base must not carry them again (no -runtime/-cudnn).
    assert base.startswith("nvidia/cuda:") and "-base-" in base, base


def test_build_context_is_exactly_the_listed_files(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    for rel in ("docker/rootfs/usr/local/bin/entry", "docker/wheelhouse/app/p-1-py3-none-any.whl",
                "docker/wheelhouse/deps/d-1-py3-none-any.whl", "docker/wheelhouse/download.log",
                "docker/build-wheelhouse.sh", ".env", "docker/wheelhouse/deps/.key"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"content of {rel}")
    (tmp_path / "docker/rootfs/usr/local/bin/entry").chmod(0o755)
    ctx = BuildContext.collect(tmp_path)
    assert ctx.files == (
        "Dockerfile",
        "docker/rootfs/usr/local/bin/entry",
        "docker/wheelhouse/app/p-1-py3-none-any.whl",
        "docker/wheelhouse/deps/d-1-py3-none-any.whl",
    )
    seen: list[tuple[int, int]] = []
    data = b"".join(ctx.stream(lambda sent, total: seen.append((sent, total))))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert list(members) == list(ctx.files)
        assert members["docker/rootfs/usr/local/bin/entry"].mode & 0o111
        assert {m.uid for m in members.values()} == {0}
        assert tar.extractfile("Dockerfile").read() == b"FROM x\n"  # type: ignore[union-attr]
    assert seen and seen[-1][0] == seen[-1][1] == ctx.size


def test_build_context_needs_the_wheelhouse(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    with pytest.raises(UsageError, match=r"build-wheelhouse\.sh"):
        BuildContext.collect(tmp_path)


def test_torch_base_context_sends_its_dockerfile_and_the_torchless_wheels(tmp_path: Path) -> None:
    for rel in ("Dockerfile", "docker/torch-base.Dockerfile", "docker/rootfs/entry",
                "docker/wheelhouse/app/p-1-py3-none-any.whl", "docker/wheelhouse/deps/torch-2-cp311-x.whl",
                "docker/wheelhouse/deps-base/typer-1-py3-none-any.whl"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    ctx = BuildContext.collect(tmp_path, torch_base=True)
    assert ctx.dockerfile == "docker/torch-base.Dockerfile"
    assert ctx.files == (
        "docker/torch-base.Dockerfile",
        "docker/rootfs/entry",
        "docker/wheelhouse/app/p-1-py3-none-any.whl",
        "docker/wheelhouse/deps-base/typer-1-py3-none-any.whl",
    )
    plan = plan_build(tmp_path, base="b:1", tag="p:x", meta=SourceMetadata("0.2.0", "unknown", ""), torch_base=True)
    assert plan.torch_base and plan.buildargs["BASE_IMAGE"] == "b:1"


def test_torch_base_dockerfile_keeps_the_images_contract() -> None:
    # The two Dockerfiles end the same way: entrypoint, default command, health check, labels.
    default = (ROOT / "Dockerfile").read_text()
    torch_base = (ROOT / "docker/torch-base.Dockerfile").read_text()
    for line in default.splitlines():
        if line.startswith(("ENTRYPOINT", "CMD", "HEALTHCHECK", "    CMD", "LABEL", "      org.")):
            assert line.rstrip(" \\") in torch_base, line


def test_base_probe_and_its_verdicts() -> None:
    found = parse_probe("python=3.11.7\nexecutable=/opt/conda/bin/python3\ntorch=2.13.0+cpu\n")
    assert found == BaseTorch("3.11.7", "/opt/conda/bin/python3", "2.13.0+cpu") and found.python_xy == "3.11"
    require_base_torch(found, "b")
    cases = [
        ("python=\n", "has no python3 on its PATH"),
        ("python=3.10.12\nexecutable=/usr/bin/python3\ntorch=2.1.0\n", r"Python 3\.10\.12; podguard needs >= 3\.11"),
        ("python=3.8.0\nexecutable=/usr/bin/python3\ntorch=\n", r"Python 3\.8\.0; podguard needs >= 3\.11"),
        ("python=3.12.1\nexecutable=/usr/bin/python3\ntorch=\n", r"\(/usr/bin/python3, Python 3\.12\.1\) has no torch"),
    ]
    for probe, message in cases:
        with pytest.raises(UsageError, match=message) as err:
            require_base_torch(parse_probe(probe), "me/img:1")
        assert "me/img:1" in err.value.message and "\n" not in err.value.message


def test_torch_base_and_python_refused_before_any_work() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "podguard", "image", "build", "--torch", "base", "--python", "3.11"],
        capture_output=True,
        text=True,
        env={"DOCKER_HOST": "unix:///nonexistent.sock", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 64, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "--python" in proc.stderr, proc.stderr


def test_image_python_from_the_probe() -> None:
    assert python_from_probe("python=3.11\nos=debian 12\n", "b") == "3.11"
    assert python_from_probe("python=\nos=ubuntu 24.04\n", "nvidia/cuda:13.0.2-base-ubuntu24.04") == "3.12"
    with pytest.raises(UsageError, match="--python"):
        python_from_probe("python=\nos=alpine 3.20\n", "alpine")


# -- timeline --------------------------------------------------------------------------------------


def test_timeline_from_stamped_logs() -> None:
    t0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    raw = (
        b"2027-01-15T08:00:00.500000000Z podguard-entrypoint: sshd started\n"
        b"2027-01-15T08:00:01.250000000Z podguard train: PASS on 8 GPU(s) in 180 ms\n"
        b"2027-01-15T08:00:01.260000000Z   report: /workspace/.podguard/reports/x.json\n"
        b"2027-01-15T08:00:02.000000000Z GPU0:[rank 0] first line\n"
        b"2027-01-15T08:00:09Z podguard: job finished successfully\n"
    )
    timeline = Timeline.from_logs(raw, t0)
    assert timeline.verdict == "PASS" and timeline.preflight_ms == 180
    assert timeline.summary is not None and timeline.summary.at == pytest.approx(1.25)
    assert timeline.first_job_line is not None and timeline.first_job_line.text == "GPU0:[rank 0] first line"
    assert timeline.first_job_line.at == pytest.approx(2.0)
    assert timeline.lines[-1].at == pytest.approx(9.0)
    assert Timeline.from_logs(b"2027-01-15T08:00:00Z no summary\n", t0).first_job_line is None


# -- the Docker SDK stays out of every other command ------------------------------------------------


def test_only_the_image_commands_import_the_docker_sdk() -> None:
    script = """
import sys, importlib, pkgutil
import podguard.image, podguard.cli.image
for mod in pkgutil.iter_modules(podguard.image.__path__):
    importlib.import_module("podguard.image." + mod.name)
from podguard.cli.app import main
try:
    main(["gpus", "--json"])
except SystemExit:
    pass
print("docker" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr


def test_public_key_only_for_ssh_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from podguard.image.run import RunRequest, _environment

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id.pub").write_text("ssh-ed25519 AAAA me@x\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    text = 'name = "x"\nimage = "i"\n[cpu]\nid = "c"\n'
    with_ssh = read_pod_spec(_spec(tmp_path, text))
    without = read_pod_spec(_spec(tmp_path, "ssh = false\n" + text))
    assert _environment(RunRequest(spec=with_ssh), "p1", GpuSet(), [])["PUBLIC_KEY"] == "ssh-ed25519 AAAA me@x"
    env = _environment(RunRequest(spec=without, env={"A": "1"}), "p2", parse_gpus("2"), [])
    assert "PUBLIC_KEY" not in env
    assert (env["RUNPOD_POD_ID"], env["RUNPOD_GPU_COUNT"], env["A"]) == ("p2", "2", "1")

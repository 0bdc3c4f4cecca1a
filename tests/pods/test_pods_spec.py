"""Pod spec files: the examples in runpod/, the checks, and that a bad spec sends no request at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from pods_support import A40_SPEC, pg, standin, write_spec  # noqa: F401 (fixture)

from podguard.errors import UsageError
from podguard.pods.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
BASE = {"name": "n", "image": "img:1", "gpu": {"types": ["NVIDIA A40"]}}


@pytest.mark.parametrize("path", sorted((ROOT / "runpod").glob("*.toml")), ids=lambda p: p.name)
def test_the_example_specs_are_valid(path):
    spec = load_spec(path)
    assert spec.candidates()
    assert not (ROOT / "runpod" / "__init__.py").exists()


def test_defaults_match_the_contract():
    spec = parse_spec(BASE)
    assert (spec.args, spec.cloud, spec.ssh, spec.disk_gb, spec.ready_timeout_s) == ("train", "SECURE", True, 50, 1800)
    assert spec.candidates()[0].ssh is True  # REST's startSsh defaults to false: the spec's default is sent


def test_candidates_try_gpu_types_first_then_data_centres_in_order():
    spec = parse_spec({**BASE, "data_centers": ["EU-RO-1", "US-KS-2"], "gpu": {"types": ["A", "B"], "count": 2}})
    assert [(c.gpu.type, c.data_center) for c in spec.candidates()] == [  # type: ignore[union-attr]
        ("A", "EU-RO-1"),
        ("B", "EU-RO-1"),
        ("A", "US-KS-2"),
        ("B", "US-KS-2"),
    ]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"gpus": 1}, "gpus"),
        ({"gpu": {"types": ["NVIDIA A40"], "cuont": 2}}, "[gpu] cuont"),
        ({"ready": {"timeout": 5}}, "[ready] timeout"),
        ({"name": ""}, "name"),
        ({"name": "a\nb"}, "name"),
        ({"image": "has space"}, "image"),
        ({"cloud": "secure"}, "cloud"),
        ({"ports": ["22"]}, "ports"),
        ({"ports": ["70000/tcp"]}, "ports"),
        ({"ports": ["22/tcp", "22/tcp"]}, "ports"),
        ({"disk_gb": 0}, "disk_gb"),
        ({"disk_gb": True}, "disk_gb"),
        ({"bid_per_gpu": 1.0}, "bid_per_gpu"),
        ({"gpu": {"types": []}}, "[gpu] types"),
        ({"gpu": {"types": ["NVIDIA A40"], "count": 0}}, "[gpu] count"),
        ({"cpu": {"id": "cpu3c", "vcpus": 4}}, "[gpu]/[cpu]"),
        ({"volume": {"size_gb": 5}}, "[volume] size_gb"),
        ({"volume": {"size_gb": 20, "path": "rel"}}, "[volume] path"),
        ({"volume": {"size_gb": 20}, "network_volume": {"id": "v"}}, "[volume]/[network_volume]"),
        ({"env": {"1BAD": "x"}}, "[env] '1BAD'"),
        ({"env": {"A": ["list"]}}, "[env] A"),
        ({"ready": {"timeout_s": -1}}, "[ready] timeout_s"),
        ({"data_centers": "EU-RO-1"}, "data_centers"),
        ({"checkpoints": {"dir": "/c", "stor": "s3://b/p"}}, "[checkpoints] stor"),
        ({"checkpoints": {"dir": "ckpt"}}, "[checkpoints] dir"),
        ({"checkpoints": {"dir": "/c", "store": "gs://bucket/p"}}, "[checkpoints] store"),
        ({"checkpoints": {"dir": "/c", "store": "s3://B_ad/p"}}, "[checkpoints] store"),
        ({"checkpoints": {"dir": "/c", "store": "file://relative"}}, "[checkpoints] store"),
        ({"checkpoints": {"store": "s3://bucket/p"}}, "[checkpoints] store"),
        ({"checkpoints": {"dir": "/c", "keep": 0}}, "[checkpoints] keep"),
        ({"checkpoints": {"dir": "/c", "keep": "2"}}, "[checkpoints] keep"),
        ({"checkpoints": {"dir": "/c", "save_signal": "KILL"}}, "[checkpoints] save_signal"),
        ({"checkpoints": {"dir": "/c", "save_signal": "NOPE"}}, "[checkpoints] save_signal"),
        ({"checkpoints": {"dir": "/c", "save_grace": "0"}}, "[checkpoints] save_grace"),
        ({"checkpoints": {"dir": "/c", "save_grace": "soon"}}, "[checkpoints] save_grace"),
        ({"checkpoints": {"dir": "/c"}, "env": {"PODGUARD_CHECKPOINTS": "/d"}}, "[checkpoints] dir"),
    ],
)
def test_a_bad_spec_names_the_key(change, named):
    with pytest.raises(UsageError) as info:
        parse_spec({**BASE, **change}, where="pod.toml")
    assert info.value.message.startswith(f"pod.toml: {named} "), info.value.message


def test_cpu_pods_cannot_be_spot_or_have_host_volumes():
    cpu = {"name": "c", "image": "i", "cpu": {"id": "cpu3c", "vcpus": 4}}
    assert parse_spec(cpu).cpu is not None
    for extra, named in (({"interruptible": True}, "interruptible"), ({"volume": {"size_gb": 20}}, "[volume]")):
        with pytest.raises(UsageError, match=named):
            parse_spec({**cpu, **extra})
    with pytest.raises(UsageError, match="power of two"):
        parse_spec({**cpu, "cpu": {"id": "cpu3c", "vcpus": 6}})


def test_checkpoints_reach_the_pod_as_their_variables():
    table = {"dir": "/workspace/ckpt", "store": "s3://my-bucket/run1", "keep": 3, "save_signal": "USR2"}
    spec = parse_spec({**BASE, "checkpoints": {**table, "save_grace": "2m"}})
    assert {k: v for k, v in spec.env.items() if k.startswith("PODGUARD_")} == {
        "PODGUARD_CHECKPOINTS": "/workspace/ckpt",
        "PODGUARD_CHECKPOINT_STORE": "s3://my-bucket/run1",
        "PODGUARD_STORE_KEEP": "3",
        "PODGUARD_SAVE_SIGNAL": "USR2",
        "PODGUARD_SAVE_GRACE": "2m",
    }
    assert spec.store == "s3://my-bucket/run1"
    local = parse_spec({**BASE, "checkpoints": {"dir": "/workspace/ckpt", "store": "file:///mnt/volume/run1"}})
    assert local.store == "file:///mnt/volume/run1" and parse_spec(BASE).store == ""


def test_env_values_and_secret_references_pass_through_untouched():
    spec = parse_spec({**BASE, "env": {"HF_TOKEN": "{{ RUNPOD_SECRET_hf }}", "N": 3, "F": True}})
    assert spec.env == {"HF_TOKEN": "{{ RUNPOD_SECRET_hf }}", "N": "3", "F": "true"}


@pytest.mark.parametrize(
    "body",
    [
        'name = "x"\nimage = "i"\n[gpu]\ntypes = ["NVIDIA A40"]\nbogus = 1\n',
        "name = 'unterminated\n",
        "",
        'name = "x"\nimage = "i"\n[gpu]\ntypes = ["NVIDIA A40"]\n[checkpoints]\nstore = "s3://bucket/p"\n',
    ],
    ids=["unknown-key", "bad-toml", "empty", "store-without-dir"],
)
def test_pod_up_with_a_bad_spec_exits_64_and_sends_no_request(standin, tmp_path, body):  # noqa: F811
    spec = tmp_path / "pod.toml"
    spec.write_text(body)
    proc = pg(["pod", "up", "--spec", str(spec)])
    assert proc.returncode == 64, proc.stderr
    assert proc.stderr.startswith("podguard: error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert standin.requests == []


def test_template_push_and_a_missing_spec_file(standin, tmp_path):  # noqa: F811
    proc = pg(["template", "push", "--spec", str(tmp_path / "nope.toml")])
    assert proc.returncode == 64 and "does not exist" in proc.stderr
    assert standin.requests == []
    spec = write_spec(tmp_path / "pod.toml", A40_SPEC)
    first = pg(["template", "push", "--spec", str(spec), "--json"])
    second = pg(["template", "push", "--spec", str(spec), "--json"])
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert '"created": true' in first.stdout and '"created": false' in second.stdout
    (template,) = standin.world.templates.values()
    assert (template["args"], template["env"]) == ("train -- python train.py", {"WANDB_PROJECT": "demo"})

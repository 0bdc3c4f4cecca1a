"""What the built image carries: no dead layer, no wheel, no laptop-only package, its OCI labels, and no
secret from the build machine in any layer, in its config or in `docker history`."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from imagetools import BASE_IMAGE, ROOT, BuiltImage, docker

from podguard import __version__

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# Python distributions the image may hold beyond podguard's core + torch closure: the virtualenv's seeds.
VENV_SEEDS = {"pip", "setuptools"}


@dataclass
class Layer:
    diff_id: str
    size: int = 0
    files: int = 0
    regular: set[str] = field(default_factory=set)  # regular files
    whiteouts: list[str] = field(default_factory=list)
    wheels: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # "secret in path"


def _chunks(fh, size: int = 1 << 20) -> Iterator[bytes]:  # type: ignore[no-untyped-def]
    while chunk := fh.read(size):
        yield chunk


def _scan_layer(blob, needles: tuple[bytes, ...], layer: Layer) -> None:  # type: ignore[no-untyped-def]
    overlap = max((len(n) for n in needles), default=1)
    with tarfile.open(fileobj=blob, mode="r|") as tar:
        for member in tar:
            layer.files += 1
            name = member.name
            if member.isfile():
                layer.regular.add(name)
            if Path(name).name.startswith(".wh."):
                layer.whiteouts.append(name)
            if name.endswith(".whl"):
                layer.wheels.append(name)
            hits = {n for n in needles if n in name.encode()}
            if member.isfile() and needles:
                tail = b""
                for chunk in _chunks(tar.extractfile(member)):
                    window = tail + chunk
                    hits |= {n for n in needles if n in window}
                    tail = window[-overlap:]
            layer.secrets += [f"{n.decode()} in {name}" for n in hits]


def _saved_layers(image: str, tmp: Path, needles: tuple[bytes, ...]) -> tuple[list[Layer], bytes]:
    """Every layer of `image` (bottom first), scanned; and the image's config JSON."""
    archive = tmp / "image.tar"
    subprocess.run(["docker", "save", "-o", str(archive), image], check=True, timeout=300)
    with tarfile.open(archive) as saved:
        manifest = json.load(saved.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
        config = saved.extractfile(manifest["Config"]).read()  # type: ignore[union-attr]
        layers = []
        for path in manifest["Layers"]:
            member = saved.getmember(path)
            layer = Layer(diff_id=path, size=member.size)
            _scan_layer(saved.extractfile(member), needles, layer)
            layers.append(layer)
    archive.unlink()
    return layers, config


@pytest.fixture(scope="module")
def scanned(built: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Layer], bytes]:
    needles = tuple(s.encode() for s in built.secrets)
    return _saved_layers(built.tag, tmp_path_factory.mktemp("saved"), needles)


def test_no_dead_layer_and_no_wheel(image: str, scanned: tuple[list[Layer], bytes]) -> None:
    layers, _ = scanned
    base_layers = len(json.loads(docker("image", "inspect", BASE_IMAGE, check=True).stdout)[0]["RootFS"]["Layers"])
    ours = layers[base_layers:]
    history = docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image, check=True).stdout
    print(f"\n[image] layers of {image} (docker history):\n{history}")
    assert ours, "the image added no layer to its base"
    assert not [w for layer in ours for w in layer.wheels], [layer.wheels for layer in ours]
    # Dead bytes: a file deleted (whiteout) or replaced by a later layer stays in the layer that added it.
    assert not [w for layer in ours for w in layer.whiteouts], [layer.whiteouts for layer in ours]
    for i, lower in enumerate(ours):
        for upper in ours[i + 1 :]:
            assert not lower.regular & upper.regular, sorted(lower.regular & upper.regular)[:10]
    # The dependencies' layer is most of the image: podguard's own layer is small (a code change is cheap).
    sizes = sorted((layer.size for layer in ours), reverse=True)
    assert sizes[1] < sizes[0] / 50, sizes


def test_no_laptop_only_package(image: str) -> None:
    # Every installed distribution must be reachable from podguard's core requirements, its `stacks` extra (py-spy:
    # the hang watch's stacks, shipped in the image), its `store` extra (boto3: --checkpoint-store's S3 client,
    # shipped in the image) or torch's.
    script = """
import importlib.metadata as md, json
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as canon
dists = {canon(d.metadata["Name"]): d for d in md.distributions()}
seen, todo = set(), ["podguard", "torch"]
while todo:
    name = canon(todo.pop())
    if name in seen or name not in dists:
        continue
    seen.add(name)
    extras = ("", "stacks", "store") if name == "podguard" else ("",)
    for raw in dists[name].requires or []:
        req = Requirement(raw)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
            todo.append(req.name)
print(json.dumps({"installed": sorted(dists), "needed": sorted(seen)}))
"""
    proc = docker("run", "--rm", "--entrypoint", "python3", image, "-c", script, check=True)
    data = json.loads(proc.stdout)
    extra = set(data["installed"]) - set(data["needed"]) - VENV_SEEDS
    assert not extra, f"installed but not needed by podguard's core or torch: {sorted(extra)}"
    assert {"podguard", "torch", "typer", "nvidia-ml-py"} <= set(data["needed"]), data["needed"]
    assert not {"runpod", "docker", "fastapi", "paramiko", "moto"} & set(data["installed"])
    assert {"boto3", "s3transfer"} <= set(data["needed"])  # --checkpoint-store s3://... works in the image


def test_oci_labels(built: BuiltImage) -> None:
    if built.result is None:
        pytest.skip("PODGUARD_TEST_IMAGE: the image was not built by this session")
    labels = json.loads(docker("image", "inspect", built.tag, check=True).stdout)[0]["Config"]["Labels"]
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.version"] == __version__
    assert re.fullmatch(re.escape(revision) + r"(-dirty)?", labels["org.opencontainers.image.revision"]), labels
    # The source URL had a token in it; the label has the URL without it.
    assert labels["org.opencontainers.image.source"] == "https://git.example.invalid/podguard.git", labels
    assert labels["org.opencontainers.image.base.name"] == BASE_IMAGE
    full = f"{__version__}-{labels['org.opencontainers.image.revision']}"
    repository = built.tag.rsplit(":", 1)[0]
    assert set(built.result["tags"]) == {built.tag, f"{repository}:{__version__}", f"{repository}:{full}"}
    for tag in built.result["tags"]:
        inspected = json.loads(docker("image", "inspect", tag, check=True).stdout)[0]
        assert inspected["Id"] == built.result["image_id"], tag


def test_build_streams_progress(built: BuiltImage) -> None:
    if built.result is None:
        pytest.skip("PODGUARD_TEST_IMAGE: the image was not built by this session")
    assert "sending the build context" in built.progress
    assert re.search(r"^\[\s*[\d.]+s\] Step \d+/\d+ : FROM", built.progress, re.MULTILINE), built.progress[-2000:]
    assert "wheelhouse:" in built.progress


def test_no_build_secret_in_layers_config_or_history(built: BuiltImage, scanned: tuple[list[Layer], bytes]) -> None:
    if built.result is None:
        pytest.skip("PODGUARD_TEST_IMAGE: the image was not built by this session")
    layers, config = scanned
    history = docker("history", "--no-trunc", built.tag, check=True).stdout
    inspect = docker("image", "inspect", built.tag, check=True).stdout
    for secret in built.secrets:
        assert secret not in history, f"{secret} in docker history"
        assert secret not in inspect, f"{secret} in docker inspect"
        assert secret.encode() not in config, f"{secret} in the image config"
        assert secret not in built.progress, f"{secret} printed by the build"
    assert not [s for layer in layers for s in layer.secrets], [layer.secrets for layer in layers if layer.secrets]

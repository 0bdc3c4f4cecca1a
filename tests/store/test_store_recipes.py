"""Every recipe of docs/checkpoints.md's "Survive the host" section, run exactly as printed (bash), against the
hostnames it names: an HTTPS proxy on loopback ends each tunnel in TLS with a test CA's certificate for those
names and leads it to moto's S3 server (tests/store/tlsproxy.py). Nothing leaves 127.0.0.1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s3server import S3Server
from tlsproxy import LoopbackCA, TlsProxy

pytestmark = pytest.mark.slow
pytest.importorskip("cryptography")

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
SECTION = "## Survive the host: a checkpoint store"

TRAIN = """
import os, torch
from podguard.rank import resume_from
d = os.environ["PODGUARD_CHECKPOINTS"]
start = 1 if resume_from() is None else torch.load(resume_from(), weights_only=True)["step"] + 1
for step in range(start, start + 3):
    print(f"step {step}", flush=True)
if int(os.environ.get("RANK", "0")) == 0:  # (one saver, however many ranks this node was given)
    os.makedirs(d, exist_ok=True)
    torch.save({"step": start + 2}, os.path.join(d, ".step.pt.tmp"))
    os.replace(os.path.join(d, ".step.pt.tmp"), os.path.join(d, f"step-{start + 2}.pt"))
"""


def recipes() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    return re.findall(r"^```bash\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def hosts_of(recipe: str) -> list[str]:
    endpoint = re.search(r"AWS_ENDPOINT_URL_S3=https://([^/\s]+)", recipe)
    if endpoint is not None:
        return [endpoint.group(1), f"*.{endpoint.group(1)}"]
    region = re.search(r"AWS_REGION=(\S+)", recipe).group(1)  # AWS itself: virtual-hosted buckets
    if region == "us-east-1":  # (boto3's endpoint there is the global one)
        return ["*.s3.amazonaws.com", "s3.amazonaws.com"]
    return [f"*.s3.{region}.amazonaws.com", f"s3.{region}.amazonaws.com"]


def test_the_section_has_the_three_recipes():
    found = recipes()
    assert len(found) == 3
    assert [bool(re.search(pat, r)) for r, pat in zip(found, ("runpod", "r2.cloudflare", "AKIA"), strict=True)]


@pytest.mark.parametrize("index", range(3), ids=["runpod", "r2", "aws"])
def test_a_recipe_runs_exactly_as_printed(cli_node, tmp_path, index):
    recipe = recipes()[index]
    hosts = hosts_of(recipe)
    endpoints = ",".join(f"https://{h}" for h in hosts if not h.startswith("*"))
    server = S3Server.start({"MOTO_S3_CUSTOM_ENDPOINTS": endpoints} if "amazonaws" not in hosts[0] else {})
    ca = LoopbackCA(tmp_path / "ca", hosts)
    proxy = TlsProxy(server.port, ca)
    try:
        bucket, prefix = re.search(r"--checkpoint-store s3://([^/\s]+)/(\S+)", recipe).groups()
        server.bucket(bucket)
        work = tmp_path / "work"
        work.mkdir()
        (work / "train.py").write_text(TRAIN)
        env = {k: v for k, v in {**os.environ, **cli_node.env}.items() if not k.startswith("AWS_") and "PROXY" not in k}
        env.update(
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            HTTPS_PROXY=proxy.url,
            AWS_CA_BUNDLE=str(ca.bundle),
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            AWS_EC2_METADATA_DISABLED="true",
            LD_LIBRARY_PATH="",
        )
        proc = subprocess.run(
            ["bash", "-e", "-c", recipe], cwd=work, env=env, capture_output=True, text=True, timeout=180
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text
        assert f"stored step-3.pt in s3://{bucket}/{prefix}" in text, text
        keys = server.keys(bucket)
        assert f"{prefix}/step-3.pt.podguard-manifest.json" in keys, keys
        assert proxy.hosts and all(h.endswith(hosts[0].lstrip("*.")) for h in proxy.hosts), proxy.hosts
    finally:
        proxy.close()
        server.stop()

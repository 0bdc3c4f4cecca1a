"""Fixtures of the checkpoint store's tests: one moto S3 server process for the session (each test makes its own
bucket), and the AWS variables that point podguard at it."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from s3server import S3Server, store_env

_names = itertools.count()


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket on the session's server, and this process's AWS variables pointing at it."""
    for key, value in store_env(s3_server.url).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    bucket = s3_server.bucket(f"ckpt-{next(_names)}")
    return s3_server, bucket

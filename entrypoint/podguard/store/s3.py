"""The S3 API as a checkpoint store, through boto3 and its transfer manager (s3transfer): AWS S3, RunPod's
network-volume S3 API, Cloudflare R2, Backblaze B2, MinIO. Credentials, region and endpoint come from the
standard AWS variables and files (AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_S3, ...).

    backend = S3Backend(parse_store_url("s3://b/run1"))   # boto3 is imported here (the `podguard[store]` extra)
    backend.check()                                         # HeadBucket: 64 for no bucket or refused credentials

What RunPod's S3 API needs (docs/checkpoints.md, "Survive the host"): parts of at most 500 MB (PART_MAX), a read
timeout of an hour for CompleteMultipartUpload of big files (it assembles them before it answers), retries on
502 (botocore's standard retry mode, 10 attempts unless AWS_MAX_ATTEMPTS says otherwise), DeleteObject one by one
(no DeleteObjects). botocore sends a CRC-32 with every PutObject/UploadPart, which the store checks before it
accepts the bytes; afterwards the object's size, and its CRC-32 where the store reports a whole-file one (a
single-part upload), must be the file's (HeadObject). A full-object CRC-32 is not asked for on multipart uploads:
not every S3-compatible store has it, and the one that computes it at completion (moto's) halves the throughput
(bench/bench_store.py).
"""

from __future__ import annotations

import base64
import os
import threading
from typing import Any

from podguard.errors import UsageError
from podguard.store.backend import BytesMoved, Cancelled, StoreError, StoreRefused, StoreUnreachable, crc_text
from podguard.store.url import StoreUrl

__all__ = ["ENV_PART_BYTES", "PART_MAX", "S3Backend", "part_size"]

ENV_PART_BYTES = "PODGUARD_STORE_PART_BYTES"  # the multipart part size (and threshold); tests make it small
PART_DEFAULT = 16 * 2**20  # (bench/bench_store.py: 16 MiB parts kept pace with boto3's defaults, 50 MB did not)
DOWNLOAD_PART = 64 * 2**20  # ranged GETs of a restore (bench/bench_store.py: fewer, larger ranges came faster)
PARTS_MAX = 10_000  # S3's most parts per upload: a bigger file gets bigger parts (chunk_for), never above PART_MAX
PART_MIN = 5 * 2**20  # S3's smallest part
PART_MAX = 500 * 10**6  # RunPod's S3 API: parts of at most 500 MB (and PutObject below 500 MB)
CONCURRENCY = 8  # parts in flight per file
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0
COMPLETE_TIMEOUT_S = 3600.0  # CompleteMultipartUpload of a >= 10 GB file on RunPod assembles it first
MAX_ATTEMPTS = 10  # RunPod's advice for its 502s (AWS_MAX_ATTEMPTS=10, standard retry mode)
_REFUSED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
_CREDENTIAL_SOURCES = {
    "env": "the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
    "shared-credentials-file": "the AWS credentials file",
    "config-file": "the AWS config file",
    "iam-role": "the instance's IAM role",
    "container-role": "the container's IAM role",
    "assume-role": "an assumed role (AWS config file)",
    "sso": "AWS SSO (AWS config file)",
    "custom-process": "a credential_process (AWS config file)",
}


def part_size() -> int:
    """The part size: PODGUARD_STORE_PART_BYTES, else 16 MiB; kept within S3's 5 MiB and RunPod's 500 MB."""
    raw = os.environ.get(ENV_PART_BYTES, "").strip()
    if not raw:
        return PART_DEFAULT
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{ENV_PART_BYTES}={raw!r} is not a whole number of bytes, e.g. 50000000") from None
    if not PART_MIN <= value <= PART_MAX:
        raise UsageError(f"{ENV_PART_BYTES}={value} is not valid; expected {PART_MIN}-{PART_MAX} bytes")
    return value


def chunk_for(size: int, part: int) -> int:
    """The part size for a file of `size` bytes: `part`, doubled while the file would need more than 10,000 parts,
    never above RunPod's 500 MB (s3transfer's own adjustment would double past it for files over 2.7 TB)."""
    chunk = part
    while -(-size // chunk) > PARTS_MAX and chunk < PART_MAX:
        chunk = min(chunk * 2, PART_MAX)
    return chunk


def _import_boto3() -> Any:
    try:
        import boto3  # noqa: PLC0415  lazy: boto3, the podguard[store] extra: a run without a store never pays for it
    except ImportError:
        raise UsageError(
            "--checkpoint-store s3://... needs the S3 client: pip install 'podguard[store]' (boto3)"
        ) from None
    return boto3


class S3Backend:
    """See the module docstring."""

    def __init__(self, url: StoreUrl, *, attempts: int | None = None) -> None:
        boto3 = _import_boto3()
        from botocore.config import Config  # noqa: PLC0415  lazy: botocore, with boto3 (the podguard[store] extra)

        self.store_url = url
        self.url = url.text
        self.bucket = url.bucket
        self.root = f"{url.prefix}/" if url.prefix else ""
        self.session = boto3.session.Session()
        retries: dict[str, Any] = {}
        if not os.environ.get("AWS_MAX_ATTEMPTS") and not os.environ.get("AWS_RETRY_MODE"):
            retries = {"retries": {"mode": "standard", "max_attempts": attempts or MAX_ATTEMPTS}}
        elif attempts is not None:
            retries = {"retries": {"mode": os.environ.get("AWS_RETRY_MODE") or "standard", "max_attempts": attempts}}
        region = self.session.region_name or "us-east-1"  # RunPod: the data centre id; R2: auto
        pool = CONCURRENCY + 4
        common = {"connect_timeout": CONNECT_TIMEOUT_S, "max_pool_connections": pool, **retries}
        quick = Config(read_timeout=READ_TIMEOUT_S, **common)
        self.client = self.session.client("s3", region_name=region, config=quick)
        slow = self.session.client("s3", region_name=region, config=Config(read_timeout=COMPLETE_TIMEOUT_S, **common))
        self.endpoint = self.client.meta.endpoint_url
        self._managers: dict[int, Any] = {}  # part size -> transfer manager
        self._slow = slow
        self._lock = threading.Lock()

    # -- people ---------------------------------------------------------------------------------------------
    def describe_credentials(self) -> str:
        try:
            creds = self.session.get_credentials()
        except Exception as exc:  # a broken profile or credential_process: said, not raised here
            return f"no usable credentials ({_first_line(exc)})"
        if creds is None:
            return "no credentials found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials)"
        source = _CREDENTIAL_SOURCES.get(creds.method, creds.method)
        if creds.method in ("shared-credentials-file", "config-file"):
            profile = self.session.profile_name or "default"
            source = f"{source} (profile {profile})"
        key = creds.access_key or ""
        shown = f", key …{key[-4:]}" if len(key) >= 12 else ""  # the key id's tail, never the secret
        return f"{source}{shown}"

    def where(self) -> str:
        return f"{self.url} at {self.endpoint}"

    # -- the checks -------------------------------------------------------------------------------------------
    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            err = self._error(exc)
            if isinstance(err, StoreRefused):
                raise UsageError(
                    f"--checkpoint-store={self.url}: {err} (endpoint {self.endpoint}; credentials from "
                    f"{self.describe_credentials()})"
                ) from None
            raise err from None

    # -- listing and small objects ------------------------------------------------------------------------------
    def list_top(self) -> tuple[set[str], dict[str, int]]:
        folders: set[str] = set()
        files: dict[str, int] = {}
        for page in self._pages(Prefix=self.root, Delimiter="/"):
            for p in page.get("CommonPrefixes", ()):
                folders.add(p["Prefix"][len(self.root) :].rstrip("/"))
            for obj in page.get("Contents", ()):
                files[obj["Key"][len(self.root) :]] = int(obj["Size"])
        folders.discard("")
        return folders, files

    def list_tree(self, folder: str) -> dict[str, int]:
        base = f"{self.root}{folder}/"
        out: dict[str, int] = {}
        for page in self._pages(Prefix=base):
            for obj in page.get("Contents", ()):
                rel = obj["Key"][len(base) :]
                if rel and not rel.endswith("/"):  # (RunPod lists folders too)
                    out[rel] = int(obj["Size"])
        return out

    def _pages(self, **kwargs: Any) -> Any:
        try:
            yield from self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kwargs)
        except Exception as exc:
            raise self._error(exc) from None

    def read_bytes(self, key: str) -> bytes | None:
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.root + key)
            return bytes(got["Body"].read())
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise self._error(exc) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.root + key, Body=data)
        except Exception as exc:
            raise self._error(exc) from None

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.root + key)  # RunPod has no DeleteObjects
        except Exception as exc:
            if _status(exc) != 404:
                raise self._error(exc) from None

    # -- files ----------------------------------------------------------------------------------------------
    def upload_file(self, path: str, key: str, size: int, crc: int, progress: BytesMoved) -> None:
        self._upload(path, key, size, progress)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.root + key, ChecksumMode="ENABLED")
        except Exception as exc:
            raise self._error(exc) from None
        held = int(head.get("ContentLength", -1))
        if held != size:
            raise StoreError(f"{key}: the store holds {held} bytes, not {size}")
        reported, kind = head.get("ChecksumCRC32"), head.get("ChecksumType")
        # a multipart upload's CRC-32 is the parts' (COMPOSITE): each part's was checked by the store as it came
        full = kind == "FULL_OBJECT" or (kind is None and size < part_size())
        if reported and full and "-" not in reported:
            theirs = int.from_bytes(base64.b64decode(reported), "big")
            if theirs != crc:
                raise StoreError(f"{key}: the store's CRC-32 is {crc_text(theirs)}, the file's {crc_text(crc)}")

    def _upload(self, path: str, key: str, size: int, progress: BytesMoved) -> None:
        manager = self._transfers(chunk_for(size, part_size()))
        future = manager.upload(path, self.bucket, self.root + key, subscribers=[_BytesMoved(progress)])
        self._wait(future)

    def download_file(self, key: str, path: str, progress: BytesMoved) -> None:
        manager = self._transfers(max(part_size(), DOWNLOAD_PART))
        future = manager.download(self.bucket, self.root + key, path, subscribers=[_BytesMoved(progress)])
        self._wait(future)

    def _wait(self, future: Any) -> None:
        try:
            future.result()
        except Cancelled:
            raise
        except Exception as exc:
            raise self._error(exc) from None

    def _transfers(self, part: int) -> Any:
        with self._lock:
            if part not in self._managers:
                from s3transfer.manager import TransferConfig, TransferManager  # noqa: PLC0415  lazy: s3transfer, with boto3 (the podguard[store] extra)

                config = TransferConfig(
                    multipart_threshold=part, multipart_chunksize=part, max_request_concurrency=CONCURRENCY
                )
                self._managers[part] = TransferManager(_SlowCompletion(self.client, self._slow), config)
            return self._managers[part]

    def close(self) -> None:
        with self._lock:
            managers, self._managers = list(self._managers.values()), {}
        for manager in managers:
            manager.shutdown(cancel=True)

    # -- errors -----------------------------------------------------------------------------------------------
    def _error(self, exc: BaseException) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        from botocore import exceptions as bx  # noqa: PLC0415  lazy: botocore, with boto3 (the podguard[store] extra)

        where = f"{self.url} ({self.endpoint})"
        if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
            return StoreRefused(f"no credentials for {where}: {_first_line(exc)}")
        if isinstance(exc, bx.ClientError):
            error = exc.response.get("Error", {})
            code, status = str(error.get("Code", "")), _status(exc)
            if status == 404 and code in ("NoSuchBucket", "404") and "Key" not in error:
                return StoreRefused(f"the bucket {self.bucket!r} does not exist")
            if status == 403 or code in _REFUSED_CODES:
                return StoreRefused(f"the store refused the credentials ({code or status})")
            transient = status is not None and (status >= 500 or status in (408, 429))
            if transient or code in ("SlowDown", "RequestTimeout"):
                return StoreUnreachable(f"{where} answered {status} {code}".rstrip())
            return StoreRefused(f"{where} answered {status} {code}: {error.get('Message', '')}".rstrip(": "))
        if isinstance(exc, bx.BotoCoreError | OSError | ConnectionError):
            return StoreUnreachable(f"cannot reach {where}: {_first_line(exc)}")
        return StoreError(f"{where}: {type(exc).__name__}: {_first_line(exc)}")


class _SlowCompletion:
    """The transfer manager's client, but CompleteMultipartUpload goes through a client with a long read timeout
    (the store assembles a big file before it answers; every other request keeps the short one)."""

    def __init__(self, client: Any, slow: Any) -> None:
        self._client = client
        self._slow = slow

    def complete_multipart_upload(self, **kwargs: Any) -> Any:
        return self._slow.complete_multipart_upload(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _BytesMoved:
    """An s3transfer subscriber that reports the bytes moved (the callback may raise Cancelled)."""

    def __init__(self, progress: BytesMoved) -> None:
        self.progress = progress

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        pass

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        self.progress(bytes_transferred)

    def on_done(self, future: Any, **kwargs: Any) -> None:
        pass


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__

"""`--checkpoint-store URL`: what it names, checked without any request.

    url = parse_store_url("s3://my-bucket/llm-train")   # StoreUrl("s3", bucket="my-bucket", prefix="llm-train")
    url = parse_store_url("file:///mnt/volume/ckpt")    # StoreUrl("file", path="/mnt/volume/ckpt")
    url.join("checkpoint-1200")                         # 's3://my-bucket/llm-train/checkpoint-1200'

A bad URL is a UsageError (exit 64) naming it and what is valid: an unknown scheme, an S3 bucket name S3 would
refuse, a `file://` URL with a host or a relative path. Pure: no import of the S3 library, no request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from podguard.errors import UsageError

__all__ = ["SCHEMES", "StoreUrl", "parse_store_url"]

SCHEMES = ("s3", "file")
# S3's bucket naming rules (3-63 characters; lower case, digits, dots, hyphens), widened to what S3-compatible
# stores accept: RunPod's bucket is the network volume id (lower case and digits), R2 and MinIO follow S3's rules.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
VALID = "s3://BUCKET/PREFIX (AWS S3 or an S3-compatible store) or file:///ABSOLUTE/PATH"


@dataclass(frozen=True)
class StoreUrl:
    scheme: str  # "s3" | "file"
    bucket: str = ""  # s3
    prefix: str = ""  # s3: the key prefix, without leading or trailing "/" ("" = the bucket's top)
    path: str = ""  # file: an absolute folder

    @property
    def text(self) -> str:
        if self.scheme == "file":
            return f"file://{self.path}"
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def join(self, name: str) -> str:
        """The URL of `name` under the store's root (what lines and records show)."""
        return f"{self.text.rstrip('/')}/{name}"

    def __str__(self) -> str:
        return self.text


def parse_store_url(raw: object, name: str = "--checkpoint-store") -> StoreUrl | None:
    """The store a URL names; None for an empty value (no store). UsageError (64) for a bad one."""
    text = "" if raw is None else str(raw).strip()
    if not text:
        return None
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        shown = f"scheme {parts.scheme + '://'!r}" if parts.scheme else "no scheme"
        raise UsageError(f"{name}={text!r} has {shown}; expected {VALID}")
    if parts.query or parts.fragment:
        raise UsageError(f"{name}={text!r}: a store URL has no '?' or '#' part; expected {VALID}")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{name}={text!r} names a host ({parts.netloc}); expected file:///ABSOLUTE/PATH")
        path = unquote(parts.path)
        if not path.startswith("/") or path.rstrip("/") == "":
            raise UsageError(f"{name}={text!r} is not an absolute folder below /; expected file:///ABSOLUTE/PATH")
        return StoreUrl("file", path=path.rstrip("/"))
    bucket = parts.netloc
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise UsageError(
            f"{name}={text!r}: {bucket!r} is not a valid bucket name (3-63 lower-case letters, digits, '.', '-'); "
            f"expected {VALID}"
        )
    prefix = "/".join(p for p in unquote(parts.path).split("/") if p)
    if any(p in (".", "..") for p in prefix.split("/")):
        raise UsageError(f"{name}={text!r}: the prefix may not hold '.' or '..'; expected {VALID}")
    return StoreUrl("s3", bucket=bucket, prefix=prefix)

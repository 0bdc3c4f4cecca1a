"""Where the RunPod API key and base URL come from.

    key = load_api_key()          # RUNPOD_API_KEY, else [default] api_key in ~/.runpod/config.toml
    url = api_base_url()          # RUNPOD_API_BASE_URL, default https://api.runpod.io

The key object never shows its value (`str()`/`repr()` print `***`); the transports put it only in the
`Authorization` header, and once loaded it is masked in every console line (`console.mask`). A missing or
unreadable key is an `ApiError(AUTH)`: exit 77 with one line that names where the key is read from.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from podguard import console
from podguard.errors import UsageError
from podguard.pods.errors import ApiError, ApiErrorKind

__all__ = ["ENV_BASE_URL", "ENV_KEY", "ApiKey", "api_base_url", "config_path", "key_hint", "load_api_key"]

ENV_KEY = "RUNPOD_API_KEY"
ENV_BASE_URL = "RUNPOD_API_BASE_URL"
DEFAULT_BASE_URL = "https://api.runpod.io"
PROFILE = "default"


@dataclass(frozen=True)
class ApiKey:
    """An API key and where it was read from; its value never appears in str/repr."""

    value: str = field(repr=False)
    source: str

    def __str__(self) -> str:
        return "***"

    def scrub(self, text: str) -> str:
        """`text` with every occurrence of the key replaced (servers may echo what they were sent)."""
        return text.replace(self.value, "***") if self.value else text


def config_path() -> Path:
    """The SDK's credentials file (`runpod config` writes it)."""
    return Path(os.path.expanduser("~")) / ".runpod" / "config.toml"


def key_hint() -> str:
    return f"set {ENV_KEY} or put api_key under [{PROFILE}] in {config_path()}"


def load_api_key(env: Mapping[str, str] | None = None) -> ApiKey:
    """The key from RUNPOD_API_KEY, else from ~/.runpod/config.toml like the SDK; ApiError(AUTH) if none."""
    env = os.environ if env is None else env
    raw = env.get(ENV_KEY, "").strip()
    if raw:
        return _checked(raw, ENV_KEY)
    path = config_path()
    if not path.is_file():
        raise ApiError(ApiErrorKind.AUTH, f"no RunPod API key: {key_hint()}")

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ApiError(
            ApiErrorKind.AUTH, f"{path} cannot be read as TOML ({type(exc).__name__}); {key_hint()}"
        ) from None
    profile = data.get(PROFILE)
    value = profile.get("api_key") if isinstance(profile, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise ApiError(ApiErrorKind.AUTH, f"no api_key under [{PROFILE}] in {path}; {key_hint()}")
    return _checked(value.strip(), f"{path} [{PROFILE}]")


def _checked(value: str, source: str) -> ApiKey:
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in value):
        raise ApiError(
            ApiErrorKind.AUTH, f"the API key from {source} contains spaces or control characters; {key_hint()}"
        )
    console.mask(value)  # no console line shows it from now on (a server's error text may echo it)
    return ApiKey(value, source)


def api_base_url(env: Mapping[str, str] | None = None) -> str:
    """RUNPOD_API_BASE_URL without a trailing slash; REST lives under /v2 and GraphQL under /graphql."""
    env = os.environ if env is None else env
    raw = (env.get(ENV_BASE_URL) or DEFAULT_BASE_URL).strip().rstrip("/")
    bad = UsageError(f"{ENV_BASE_URL}={raw!r} is not valid; expected an http(s) URL like {DEFAULT_BASE_URL}")
    if "@" in raw:
        raise UsageError(f"{ENV_BASE_URL} must not carry credentials; the key goes in {ENV_KEY}")
    try:
        parts = urlsplit(raw)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise bad
    return raw

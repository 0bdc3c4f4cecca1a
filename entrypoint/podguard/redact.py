"""Keep secrets out of everything podguard writes or prints: reports, outcome records, leases, logs.

    >>> redact_argv(["python", "train.py", "--hf_token", "hf_abcdefghijklmnopqrstuvwxyz0123", "--lr=3e-4"])
    ['python', 'train.py', '--hf_token', '***', '--lr=3e-4']

An option or variable whose name looks secret (token, key, secret, password, credential, auth) has its
value replaced, whether joined by `=` or given as the next argument; well-known token formats (Hugging
Face, OpenAI, GitHub, Slack, AWS, RunPod, W&B-style `Bearer`) are replaced wherever they appear.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

__all__ = ["MASK", "is_secret_name", "redact_argv", "redact_command", "redact_env", "redact_text", "redact_tokens"]

MASK = "***"

# A name is split into parts at - _ . (HF_TOKEN -> hf, token); it is secret when a part is one of these,
# or ends in token/key/secret (apikey, hftoken). Counts and data are not: --max-new-tokens, --num-keys,
# podguard's own --cache-key, --public-key.
_SECRET_PARTS = {
    "token",
    "secret",
    "secrets",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "credential",
    "credentials",
    "auth",
    "authorization",
    "key",
    "apikey",
    "cookie",
    "session",
}
_SECRET_SUFFIXES = ("token", "apikey", "secret", "password")
_NOT_SECRET_BEFORE = {"cache", "sort", "public", "primary", "foreign", "partition", "max", "min", "num", "n"}
_NAME_PARTS = re.compile(r"[-_.]+")

# Token formats recognised anywhere in a string.
_TOKEN_FORMATS = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-(proj-|ant-)?[A-Za-z0-9_-]{20,}"  # OpenAI / Anthropic
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|rpa_[A-Za-z0-9]{20,}"  # RunPod API key
    r"|glpat-[A-Za-z0-9_-]{20,})"  # GitLab
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+):[^/\s@]+@")
# NAME=value and --name=value / --name value inside free text (a shell line, a log line).
_ASSIGNMENT = re.compile(
    r"(?P<name>(?:--?)?[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>=|:\s*|\s+)(?P<value>\"[^\"]*\"|'[^']*'|\S+)"
)


def is_secret_name(name: str) -> bool:
    """True for HF_TOKEN, --api-key, wandb_key, DB_PASSWORD; False for --cache-key, --max-tokens, --lr."""
    parts = [p for p in _NAME_PARTS.split(name.lower()) if p]
    for i, part in enumerate(parts):
        if part in _SECRET_PARTS or (len(part) > 3 and part.endswith(_SECRET_SUFFIXES)):
            if i > 0 and parts[i - 1] in _NOT_SECRET_BEFORE:
                continue
            return True
    return False


def redact_tokens(text: str) -> str:
    """Only the token formats (hf_..., sk-..., rpa_..., Bearer ..., user:password@ in a URL): what can be masked
    in any text without reading it as `name: value` (the console's lines: "an API key: exiting 124" is prose)."""
    return _formats(text)


def _formats(text: str) -> str:
    text = _TOKEN_FORMATS.sub(MASK, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}:{MASK}@", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of `argv` with secret option values and token-shaped arguments masked."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, eq, _value = arg.partition("=")
        if eq and name and not name.startswith(("/", ".")) and is_secret_name(name):
            out.append(f"{name}={MASK}")
            continue
        if arg.startswith("-") and not eq and is_secret_name(arg):
            out.append(arg)
            mask_next = True
            continue
        out.append(_formats(arg))
    return out


def redact_command(argv: Sequence[str]) -> str:
    """`shlex.join` of the redacted argv: the form reports and log lines show."""
    return shlex.join(redact_argv(argv))


def redact_text(text: str) -> str:
    """Free text (a command line as one string, a log line) with secret values and tokens masked."""

    def assignment(m: re.Match[str]) -> str:
        name = m.group("name")
        if not is_secret_name(name):
            return m.group(0)
        if m.group("sep").strip() == "" and not name.startswith("-"):
            return m.group(0)  # "token expires" in prose: only options take a separate value
        return f"{name}{m.group('sep')}{MASK}"

    return _ASSIGNMENT.sub(assignment, _formats(text))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of secret-named variables (and token-shaped values) masked."""
    return {k: (MASK if is_secret_name(k) and v else _formats(v)) for k, v in env.items()}

"""A spec's `[checkpoints]` table: where the job's checkpoints live and where they are mirrored, as the `PODGUARD_*`
variables the pod's podguard reads (as `[limits]` is passed: pods/limits.py).

    env = checkpoints_env({"dir": "/workspace/ckpt", "store": "s3://b/run1", "keep": 2}, spec_env, where="pod.toml")
    # {"PODGUARD_CHECKPOINTS": "/workspace/ckpt", "PODGUARD_CHECKPOINT_STORE": "s3://b/run1",
    #  "PODGUARD_STORE_KEEP": "2"}

Every value is checked before any request (64 naming the key and the value): `dir` an absolute path in the pod,
`store` `s3://BUCKET/PREFIX` or `file:///PATH` (and it needs `dir`), `keep` a whole number >= 1, `save_signal` a
signal the job can catch (USR1, SIGUSR2, 10), `save_grace` a duration > 0. With a store, `pod keep` may replace a
pod without a network volume, in any data centre the spec allows: the work comes back from the store.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Mapping
from typing import Any

from podguard.durations import parse_duration
from podguard.errors import UsageError

__all__ = ["CHECKPOINT_KEYS", "checkpoints_env", "store_of"]

# key in [checkpoints] -> the variable on the pod
CHECKPOINT_KEYS = {
    "dir": "PODGUARD_CHECKPOINTS",
    "store": "PODGUARD_CHECKPOINT_STORE",
    "keep": "PODGUARD_STORE_KEEP",
    "save_signal": "PODGUARD_SAVE_SIGNAL",
    "save_grace": "PODGUARD_SAVE_GRACE",
}
# S3's bucket naming rules (3-63 of lowercase letters, digits, dots and hyphens, starting and ending alphanumeric)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def store_of(env: Mapping[str, str]) -> str:
    """The checkpoint store the pod's env names ("" when none)."""
    return env.get(CHECKPOINT_KEYS["store"], "").strip()


def checkpoints_env(table: Mapping[str, Any], env: Mapping[str, str], *, where: str) -> dict[str, str]:
    """The variables for `[checkpoints]` (already checked for unknown keys); UsageError on a bad value, when `[env]`
    sets the same variable, or a store without a dir."""
    out: dict[str, str] = {}
    for key, value in table.items():
        name = f"{where}: [checkpoints] {key}"
        out[CHECKPOINT_KEYS[key]] = _CHECKS[key](value, name)
        if CHECKPOINT_KEYS[key] in env:
            raise UsageError(f"{name} and [env] {CHECKPOINT_KEYS[key]} set the same setting; keep one")
    if "store" in table and "dir" not in table and CHECKPOINT_KEYS["dir"] not in env:
        raise UsageError(
            f"{where}: [checkpoints] store = {table['store']!r} needs [checkpoints] dir: the folder in the pod whose "
            'checkpoints are mirrored (e.g. dir = "/workspace/ckpt")'
        )
    return out


def _text(value: Any, name: str, valid: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{name} = {value!r} is not valid; expected {valid}")
    return value.strip()


def _dir(value: Any, name: str) -> str:
    valid = "an absolute path in the pod, e.g. /workspace/ckpt"
    text = _text(value, name, valid)
    if not text.startswith("/") or any(ord(ch) < 0x20 for ch in text):
        raise UsageError(f"{name} = {value!r} is not valid; expected {valid}")
    return text


def _store(value: Any, name: str) -> str:
    valid = "s3://BUCKET/PREFIX (AWS S3 or an S3-compatible store) or file:///PATH"
    text = _text(value, name, valid)
    scheme, sep, rest = text.partition("://")
    if sep and scheme == "s3":
        bucket = rest.split("/", 1)[0]
        if _BUCKET.match(bucket) and ".." not in bucket:
            return text
        raise UsageError(f"{name} = {value!r} is not valid: {bucket!r} is not an S3 bucket name; expected {valid}")
    if sep and scheme == "file" and rest.startswith("/") and rest.strip("/"):
        return text
    raise UsageError(f"{name} = {value!r} is not valid; expected {valid}")


def _keep(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} = {value!r} is not valid; expected a whole number >= 1 (checkpoints the store keeps)")
    return str(value)


def _save_signal(value: Any, name: str) -> str:
    valid = "a signal the job can catch, e.g. USR1 or USR2"
    text = _text(value, name, valid).upper()
    try:
        named = text if text.startswith("SIG") else f"SIG{text}"
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[named]
    except (KeyError, ValueError):
        raise UsageError(f"{name} = {value!r} is not valid; expected {valid}") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise UsageError(f"{name} = {value!r} is not valid: {sig.name} cannot be caught; expected {valid}")
    return text


def _save_grace(value: Any, name: str) -> str:
    valid = "a duration > 0, e.g. 90s, 2m or 120"
    seconds = None
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        with contextlib.suppress(UsageError):
            seconds = parse_duration(value, name)
    if seconds is None:
        raise UsageError(f"{name} = {value!r} is not valid; expected {valid}")
    return str(value).strip()


_CHECKS = {"dir": _dir, "store": _store, "keep": _keep, "save_signal": _save_signal, "save_grace": _save_grace}

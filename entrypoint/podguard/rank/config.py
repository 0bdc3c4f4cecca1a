"""Training presets and config files, validated with one-line errors (UsageError: exit 64).

    config = build_config("ci", "train.toml", {"steps": 500})   # preset < config file < explicit overrides

Every key is known and every value checked: a typo ("stpes") is an error naming the file, the key, the
bad value and what is valid, never a silent default.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from podguard.errors import UsageError

NAN_POLICIES = ("skip", "stop")


@dataclass(frozen=True)
class TrainConfig:
    """The demo job's knobs. `batch_size` is per rank; the global batch is batch_size * world_size."""

    preset: str = "ci"
    steps: int = 200
    batch_size: int = 64
    lr: float = 3e-3
    input_dim: int = 32
    hidden: int = 64
    layers: int = 2
    classes: int = 8
    samples: int = 8192  # size of the synthetic dataset (prepared once, cached)
    seed: int = 0
    log_every: int = 50  # progress line every N steps (and at the last step)
    grad_clip: float = 1.0
    nan_policy: str = "skip"
    nan_max_consecutive: int = 3
    import_slots: int = 1  # ranks allowed to import torch at the same time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, TrainConfig] = {
    # Tiny: the default for the demo job; 2 CPU ranks finish in seconds, including torch import.
    "ci": TrainConfig(),
    # The seed's debug mode: small model, few steps, a line every step, stop at the first NaN.
    "debug": TrainConfig(
        preset="debug",
        steps=10,
        batch_size=16,
        lr=1e-3,
        hidden=64,
        layers=2,
        samples=1024,
        log_every=1,
        nan_policy="stop",
        nan_max_consecutive=1,
    ),
    # The seed's production mode, scaled to a synthetic task: a deep MLP that keeps a GPU busy.
    "production": TrainConfig(
        preset="production",
        steps=10000,
        batch_size=256,
        lr=3e-4,
        input_dim=128,
        hidden=1024,
        layers=32,
        classes=64,
        samples=131072,
        log_every=100,
        nan_policy="skip",
        nan_max_consecutive=5,
    ),
}
DEFAULT_PRESET = "ci"

_INT_MIN: dict[str, int] = {
    "steps": 1,
    "batch_size": 1,
    "input_dim": 1,
    "hidden": 1,
    "layers": 1,
    "classes": 2,
    "samples": 1,
    "seed": 0,
    "log_every": 1,
    "nan_max_consecutive": 1,
    "import_slots": 1,
}
_FLOAT_POSITIVE = ("lr", "grad_clip")
_CHOICES: dict[str, tuple[str, ...]] = {"nan_policy": NAN_POLICIES, "preset": tuple(PRESETS)}
KEYS = tuple(f.name for f in fields(TrainConfig))


def preset(name: str) -> TrainConfig:
    """The named preset, or a UsageError listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"preset {name!r} is not valid; valid presets: {', '.join(PRESETS)}") from None


def validate_value(key: str, value: Any, *, source: str = "config") -> Any:
    """Check one key's value; return it normalised (int for int keys, float for float keys)."""
    where = f"{source}: " if source else ""
    if key not in KEYS:
        close = difflib.get_close_matches(key, KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"{where}unknown key {key!r}{hint}; valid keys: {', '.join(KEYS)}")
    if key in _CHOICES:
        if not isinstance(value, str) or value not in _CHOICES[key]:
            raise UsageError(f"{where}{key}={value!r} is not valid; valid: {', '.join(_CHOICES[key])}")
        return value
    if key in _INT_MIN:
        minimum = _INT_MIN[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UsageError(f"{where}{key}={value!r} is not valid; it must be an integer >= {minimum}")
        return value
    if key in _FLOAT_POSITIVE:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < float(value) < float("inf"):
            raise UsageError(f"{where}{key}={value!r} is not valid; it must be a number > 0")
        return float(value)
    raise AssertionError(f"no validation rule for {key}")  # a new field without a rule is a bug here


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a .json or .toml file of overrides (it may name a `preset` too)."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise UsageError(
            f"config file {str(file)!r}: unsupported type {suffix or '(no extension)'!r}; use .json or .toml"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file {str(file)!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"config file {str(file)!r} cannot be read: {exc}") from None
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (ValueError, TypeError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        kind = "JSON" if suffix == ".json" else "TOML"
        raise UsageError(f"config file {str(file)!r} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {str(file)!r}: the top level must be an object of key: value pairs")
    source = f"config file {str(file)!r}"
    return {key: validate_value(key, value, source=source) for key, value in data.items()}


def build_config(
    preset_name: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> TrainConfig:
    """Preset, then the config file, then explicit overrides (None values are ignored). The preset is the
    explicit `preset_name`, else the file's `preset` key, else the default ("ci")."""
    from_file = load_config_file(config_file) if config_file is not None else {}
    name = preset_name or from_file.get("preset") or DEFAULT_PRESET
    config = preset(name)
    changes = {k: v for k, v in from_file.items() if k != "preset"}
    for key, value in (overrides or {}).items():
        if value is not None:
            changes[key] = validate_value(key, value, source="option")
    config = replace(config, **changes)
    if config.batch_size > config.samples:
        raise UsageError(
            f"batch_size={config.batch_size} is larger than the dataset (samples={config.samples}); "
            "lower batch_size or raise samples"
        )
    return config

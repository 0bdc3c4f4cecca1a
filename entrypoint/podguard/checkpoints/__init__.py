"""The checkpoint finder: which checkpoints are under DIR, which are whole, and which one a restart resumes from.

    finding = find_checkpoints(directory)     # header reads only; nothing under DIR is changed
    finding.chosen, finding.skipped           # the newest whole one; the newer ones that are not whole
    resume_env(finding), resume_lines(finding, time.time())

Layouts and their "whole" rules: docs/checkpoints.md. torch is never imported here: safetensors headers are parsed
per the format's spec, torch.save zips from their end records, torch DCP from its `.metadata` (dcp.py).
"""

from __future__ import annotations

from podguard.checkpoints.checkpoint import Checkpoint, Key, Layout, format_size
from podguard.checkpoints.render import (
    ENV_RESUME_FROM,
    ENV_RESUME_STEP,
    as_json,
    end_fragment,
    resume_env,
    resume_lines,
    table,
)
from podguard.checkpoints.scan import Finding, find_checkpoints, list_keys

__all__ = [
    "ENV_RESUME_FROM",
    "ENV_RESUME_STEP",
    "Checkpoint",
    "Finding",
    "Key",
    "Layout",
    "as_json",
    "end_fragment",
    "find_checkpoints",
    "format_size",
    "list_keys",
    "resume_env",
    "resume_lines",
    "table",
]

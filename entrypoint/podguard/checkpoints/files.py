"""The "whole" rules of single files, read from the format's own structure, never by loading the data.

    why = safetensors_why(path, size)   # "" when whole, else why not ("model.safetensors is 1.2 GB of 4.1 GB")
    why, note = torch_zip_why(path)     # a torch.save file: its zip central directory reads, data.pkl is in it

safetensors (https://github.com/huggingface/safetensors#format): 8 bytes little-endian header length N, then N
bytes of JSON whose `data_offsets` give each tensor's [begin, end) in the data that follows; a whole file is
exactly 8 + N + max(end) bytes long. torch.save (torch/serialization.py, `_use_new_zipfile_serialization`): a zip
archive whose records include `<name>/data.pkl`; zipfile reads the central directory at the end of the file, so
a file cut short does not open. Both are header reads: a 100 GB file costs the same as a small one.
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
import zipfile
from typing import Any

from podguard.checkpoints.model import format_size

__all__ = ["MAX_HEADER", "file_why", "lightning_step", "safetensors_why", "torch_zip_why"]

MAX_HEADER = 100 * 1000 * 1000  # the safetensors spec's own limit on the header (100 MB)
MAX_PICKLE = 16 * 1000 * 1000  # a data.pkl larger than this is not read for a step (tensors live outside it)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
PICKLE_MAGIC = b"\x80"  # torch.save's legacy (pre-1.6) format is a bare pickle stream


def safetensors_why(path: str, size: int | None = None) -> str:
    """ "" when the header parses and the file is as long as the header says; else why not (one phrase)."""
    name = os.path.basename(path)
    try:
        with open(path, "rb", buffering=0) as f:  # unbuffered: read the header's bytes, not a buffer more
            size = os.fstat(f.fileno()).st_size if size is None else size
            head = _read(f, 8)
            if len(head) < 8:
                return f"{name} is {size} bytes: no safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                return f"{name}: header length {n} does not fit in its {format_size(size)}"
            header = json.loads(_read(f, n))
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"
    except (ValueError, UnicodeDecodeError):
        return f"{name}: the safetensors header is not valid JSON"
    if not isinstance(header, dict):
        return f"{name}: the safetensors header is not a JSON object"
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"{name}: tensor {key!r} has no valid data_offsets"
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size != expected:
        have, want = format_size(size), format_size(expected)
        if have == want:  # a few bytes apart: "4.2 KB of 4.2 KB" would say nothing
            have, want = f"{size:,} bytes", f"{expected:,}"
        return f"{name} is {have} of {want}"
    return ""


def _read(f: Any, n: int) -> bytes:
    """Exactly n bytes (fewer only at the end of the file) from an unbuffered file."""
    out = b""
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def torch_zip_why(path: str) -> tuple[str, str]:
    """("", note) when the file is a torch.save zip whose central directory reads; (why, "") when not. A legacy
    (pickle) torch.save file cannot be checked without loading it: whole, with a note saying so."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            first = f.read(1)
        if first == PICKLE_MAGIC:
            return "", f"{name} is in torch.save's legacy format (completeness not checked)"
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})", ""
    except (zipfile.BadZipFile, ValueError, EOFError):
        return f"{name}: its zip central directory does not read (cut short?)", ""
    if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return f"{name}: a zip without data.pkl (not a torch.save file)", ""
    return "", ""


def lightning_step(path: str) -> int | None:
    """The `global_step` of a Lightning `.ckpt` (its `last.ckpt` has no step in its name), read from the opcodes
    of the zip's data.pkl: nothing is unpickled and no tensor is read. None when it is not there."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = next((i for i in archive.infolist() if i.filename.endswith("data.pkl")), None)
            if info is None or info.file_size > MAX_PICKLE:
                return None
            data = archive.read(info)
        key: object = None
        for op, arg, _ in pickletools.genops(data):
            if key == "global_step" and op.name in ("BININT", "BININT1", "BININT2", "LONG1"):
                return int(arg)
            if op.name in ("MEMOIZE", "BINPUT", "LONG_BINPUT"):
                continue  # (the pickler memoizes the key between it and its value)
            key = arg if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") else None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, KeyError):
        return None
    return None


def file_why(path: str, size: int | None = None) -> tuple[str, str]:
    """The rule for a weights file by its suffix: (why, note)."""
    if path.endswith(".safetensors"):
        return safetensors_why(path, size), ""
    return torch_zip_why(path)

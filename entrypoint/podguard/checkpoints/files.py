"""The "whole" rules of single files, read from the format's own structure, never by loading the data.

    why = safetensors_why(path, size)   # "" when whole, else why not ("model.safetensors is 1.2 GB of 4.1 GB")
    why, note = torch_zip_why(path)     # a torch.save file: its zip central directory reads, data.pkl is in it

safetensors (https://github.com/huggingface/safetensors#format): 8 bytes little-endian header length N, then N
bytes of JSON whose `data_offsets` give each tensor's [begin, end) in the data that follows; a whole file is
exactly 8 + N + max(end) bytes long. torch.save (torch/serialization.py, `_use_new_zipfile_serialization`): a zip
archive whose first record is `<name>/data.pkl`; the zip's end records (at the end of the file) say where its
central directory is, so a file cut short has none that fit. Both are header reads: a 100 GB file costs the same
as a small one, and a checkpoint's optimizer.pt with thousands of records costs one read of its end.
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
import zipfile
from typing import Any

from podguard.checkpoints.checkpoint import format_size, short_of

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
    for key, info in header.items():  # (a model's header names thousands of tensors: a tight loop)
        if key == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            begin = stop = None
        if type(begin) is not int or type(stop) is not int:
            return f"{name}: tensor {key!r} has no valid data_offsets"
        if stop > end:
            end = stop
    expected = 8 + n + end
    if size != expected:
        return f"{name} is {short_of(size, expected)}"
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


def torch_zip_why(path: str, size: int | None = None) -> tuple[str, str]:
    """("", note) when the file is a torch.save zip whose central directory reads; (why, "") when not. A legacy
    (pickle) torch.save file cannot be checked without loading it: whole, with a note saying so.

    Read from the end of the file only, as unzip does: the end-of-central-directory record (and torch's zip64
    record and locator before it), which says where the central directory starts and how long it is; a file cut
    short has no such record at its end, or one whose directory does not end where the record begins. Then the
    directory's first entry, which torch writes first: `<name>/data.pkl`."""
    name = os.path.basename(path)
    cut = f"{name}: its zip central directory does not read (cut short?)"
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size if size is None else size
            if _read(f, 1) == PICKLE_MAGIC:
                return "", f"{name} is in torch.save's legacy format (completeness not checked)"
            where = _central_directory(f, size)
            if where is None:
                return cut, ""
            start, length = where
            f.seek(start)
            head = _read(f, min(length, CD_HEAD))
            if not head.startswith(CD_ENTRY) or len(head) < 46:
                return cut, ""
            (n,) = struct.unpack_from("<H", head, 28)  # the first entry's file name length
            first = head[46 : 46 + n]
            if not (first == b"data.pkl" or first.endswith(b"/data.pkl")) and length <= MAX_PICKLE:
                head += _read(f, length - len(head))  # another writer's order: any entry named data.pkl
                first = b"data.pkl" if b"data.pkl" in head else first
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})", ""
    if not (first == b"data.pkl" or first.endswith(b"/data.pkl")):
        return f"{name}: a zip without data.pkl (not a torch.save file)", ""
    return "", ""


CD_ENTRY = b"PK\x01\x02"  # a central directory entry (APPNOTE.TXT 4.3.12)
EOCD = b"PK\x05\x06"  # end of central directory record, 22 bytes + comment (4.3.16)
ZIP64_LOCATOR = b"PK\x06\x07"  # zip64 end of central directory locator, 20 bytes (4.3.15)
ZIP64_EOCD = b"PK\x06\x06"  # zip64 end of central directory record (4.3.14)
CD_HEAD = 46 + 1024  # the first entry's fixed part and a name
_TAIL = 22 + 65535  # the EOCD record and the longest comment it can have


def _central_directory(f: Any, size: int) -> tuple[int, int] | None:
    """(offset, length) of the zip's central directory from the records at the end of the file (APPNOTE.TXT,
    https://pkware.cachefly.net/webdocs/casestudies/APPNOTE.TXT), None when they do not read or do not fit."""
    if size < 22:
        return None
    f.seek(size - 22)
    tail = _read(f, 22)
    at = size - 22
    if not tail.startswith(EOCD):  # a comment after the record (torch writes none): look further back
        back = min(size, _TAIL)
        f.seek(size - back)
        tail = _read(f, back)
        i = tail.rfind(EOCD)
        if i < 0 or i + 22 > len(tail):
            return None
        at = size - back + i
        tail = tail[i : i + 22]
    _, _, _, _, _, length, start, comment = struct.unpack("<4s4H2LH", tail)
    if at + 22 + comment != size:
        return None
    end = at  # where the central directory must end: the record (or the zip64 record before it)
    if at >= 20:
        f.seek(at - 20)
        locator = _read(f, 20)
        if locator.startswith(ZIP64_LOCATOR):  # torch writes zip64 records always (caffe2 inline_container)
            (record_at,) = struct.unpack_from("<Q", locator, 8)
            f.seek(record_at)
            record = _read(f, 56)
            if not record.startswith(ZIP64_EOCD) or len(record) < 56 or record_at + 56 > at - 20:
                return None
            length, start = struct.unpack_from("<QQ", record, 40)
            end = record_at
    if start + length != end:
        return None
    return start, length


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
    return torch_zip_why(path, size)

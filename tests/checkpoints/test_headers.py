"""The header reads that keep the finder fast on 1,000 checkpoints: a torch.save zip judged from its end records
alone, and an HF trainer_state.json from its first and last bytes (files.py, folders.py), each against files the
real libraries write, cut at every point that matters."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import writers as w

from podguard.checkpoints.files import torch_zip_why
from podguard.checkpoints.folders import json_end_why

torch = pytest.importorskip("torch")

CUT = "step.pt: its zip central directory does not read (cut short?)"


def big_torch_file(path: Path, tensors: int = 300) -> Path:
    """As an optimizer.pt: one zip record per tensor."""
    torch.save({f"t{i}": torch.full((8,), float(i)) for i in range(tensors)}, path)
    return path


def test_a_whole_torch_file_is_read_from_its_end_only(tmp_path):
    path = big_torch_file(tmp_path / "step.pt")
    assert torch_zip_why(str(path)) == ("", "")
    with zipfile.ZipFile(path) as archive:  # (the reference reader agrees)
        assert archive.namelist()[0].endswith("/data.pkl")


@pytest.mark.parametrize("keep", [1, 21, 22, 43, 100, 0.999, 0.9, 0.5, 0.01])
def test_a_torch_file_cut_anywhere_is_not_whole(tmp_path, keep):
    """Cut by 1, 21 or 22 bytes (inside the end record), by the zip64 locator (43), in the central directory, in
    the data: no end record fits."""
    path = big_torch_file(tmp_path / "step.pt")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * keep) if isinstance(keep, float) else size - keep)
    assert torch_zip_why(str(path)) == (CUT, "")


def test_bytes_after_the_end_record_are_not_whole(tmp_path):
    path = big_torch_file(tmp_path / "step.pt")
    with open(path, "ab") as f:
        f.write(b"\0" * 100)
    assert torch_zip_why(str(path)) == (CUT, "")


def test_a_zip_with_a_comment_and_without_zip64_records_is_read(tmp_path):
    """Another writer than torch's (zipfile): no zip64 records, a comment after the end record."""
    path = tmp_path / "step.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/data/0", b"\0" * 64)
        archive.comment = b"written by hand"
    assert torch_zip_why(str(path)) == ("", "")


def test_a_zip64_archive_from_zipfile_is_read(tmp_path):
    path = tmp_path / "step.pt"
    with zipfile.ZipFile(path, "w", allowZip64=True) as archive:
        with archive.open("archive/version", "w", force_zip64=True) as f:
            f.write(b"3")
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    assert torch_zip_why(str(path)) == ("", "")


def test_a_zip_that_is_no_torch_save_file(tmp_path):
    path = tmp_path / "step.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", b"hello")
    assert torch_zip_why(str(path)) == ("step.pt: a zip without data.pkl (not a torch.save file)", "")


def test_a_file_that_is_no_zip_at_all(tmp_path):
    path = tmp_path / "step.pt"
    path.write_bytes(b"PK" + b"\1" * 4096)
    assert torch_zip_why(str(path)) == (CUT, "")


def hf_state(path: Path, entries: int = 50) -> Path:
    """trainer_state.json as transformers writes it (TrainerState.save_to_json)."""
    from transformers import TrainerState

    state = TrainerState(global_step=100, max_steps=1000)
    state.log_history = [
        {"loss": 1.0 / (i + 1), "step": i * 10, "nested": {"a": [1, {"b": 2}]}} for i in range(entries)
    ]
    state.save_to_json(str(path))
    return path


def test_an_hf_trainer_state_is_whole_from_its_first_and_last_bytes(tmp_path):
    pytest.importorskip("transformers")
    path = hf_state(tmp_path / "trainer_state.json")
    assert json_end_why(str(path)) == ""


def test_an_hf_trainer_state_cut_at_any_line_is_not_whole(tmp_path):
    """Every cut: after each line (a nested `}` alone included), and one byte short of the end."""
    pytest.importorskip("transformers")
    text = hf_state(tmp_path / "full.json").read_bytes()
    path = tmp_path / "trainer_state.json"
    cuts = [*[i + 1 for i, b in enumerate(text) if b == ord("\n")][:-1], len(text) - 2]
    assert len(cuts) > 500
    for cut in cuts:
        path.write_bytes(text[:cut])
        assert json_end_why(str(path)) == "trainer_state.json does not parse (cut short?)", text[:cut][-40:]
    path.write_bytes(text[:-1])  # all but the final newline: the JSON is all there
    assert json_end_why(str(path)) == ""


@pytest.mark.parametrize("indent", [None, 0, 4])
def test_json_of_another_shape_is_parsed_whole(tmp_path, indent):
    path = tmp_path / "trainer_state.json"
    text = json.dumps({"global_step": 5, "log_history": [{"a": {"b": 1}}]}, indent=indent)
    path.write_text(text)
    assert json_end_why(str(path)) == ""
    for cut in range(1, len(text)):
        path.write_text(text[:cut])
        assert json_end_why(str(path)) == "trainer_state.json does not parse (cut short?)"


def test_an_hf_checkpoint_with_a_cut_optimizer_is_still_caught_through_the_finder(tmp_path):
    from podguard.checkpoints import find_checkpoints

    folder = w.hf_checkpoint(tmp_path, 100)
    big_torch_file(folder / "optimizer.pt")
    assert find_checkpoints(tmp_path).chosen is not None
    w.truncate(folder / "optimizer.pt", 0.99)
    (c,) = find_checkpoints(tmp_path).checkpoints
    assert c.why == "optimizer.pt: its zip central directory does not read (cut short?)"

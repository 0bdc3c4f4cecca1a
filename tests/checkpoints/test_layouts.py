"""Each recognised layout, whole and not whole, written by the real libraries (checkpoints/)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import writers as w

from podguard.checkpoints import Layout, find_checkpoints, resume_env, resume_lines
from podguard.checkpoints.files import safetensors_why, torch_zip_why
from podguard.checkpoints.steps import step_from_name


def only(root: Path):
    (c,) = find_checkpoints(root).checkpoints
    return c


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-1200", 1200),
        ("epoch=3-step=1200.ckpt", 1200),
        ("step-1200.pt", 1200),
        ("model_step_1200.safetensors", 1200),
        ("iter_0001200", 1200),
        ("global_step1200", 1200),
        ("checkpoint_3", 3),
        ("last.ckpt", None),
        ("stepper.pt", None),
    ],
)
def test_step_from_the_name(name, step):
    assert step_from_name(name) == step


def test_safetensors_whole_and_truncated(tmp_path):
    path = w.safetensors_file(tmp_path / "model-step-3.safetensors", size=4096)
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole) == (Layout.SAFETENSORS, 3, True)
    w.truncate(path, 0.5)
    why = safetensors_why(str(path))
    assert why.startswith("model-step-3.safetensors is ") and " of " in why
    assert not only(tmp_path).whole


def test_safetensors_with_a_broken_header(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes((10).to_bytes(8, "little") + b"{not json}")
    assert "not valid JSON" in safetensors_why(str(path))
    path.write_bytes(b"\x01")
    assert "no safetensors header" in safetensors_why(str(path))


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin", ".ckpt"])
def test_torch_save_zip_whole_and_truncated(tmp_path, suffix):
    path = w.torch_file(tmp_path / f"step-5{suffix}")
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole) == (Layout.TORCH, 5, True)
    w.truncate(path, 0.8)
    assert "central directory does not read" in only(tmp_path).why


def test_torch_legacy_format_is_whole_with_a_note(tmp_path):
    import torch

    path = tmp_path / "old.pt"
    torch.save({"a": 1}, path, _use_new_zipfile_serialization=False)
    why, note = torch_zip_why(str(path))
    assert why == "" and "legacy" in note


def test_dcp_whole_and_without_metadata(tmp_path):
    folder = w.dcp_folder(tmp_path / "step_40")
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole) == (Layout.DCP, 40, True)
    (folder / ".metadata").unlink()
    assert only(tmp_path).why.startswith("no .metadata")


def test_hf_trainer_checkpoint(tmp_path):
    folder = w.hf_checkpoint(tmp_path, 500)
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole) == (Layout.HF, 500, True)
    state = folder / "trainer_state.json"
    state.write_text(state.read_text()[:10])  # cut short
    assert only(tmp_path).why == "trainer_state.json does not parse (cut short?)"


def test_hf_sharded_checkpoint_with_a_missing_shard(tmp_path):
    folder = w.hf_checkpoint(tmp_path, 9, sharded=True)
    assert only(tmp_path).whole
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert (
        only(tmp_path).why
        == "model-00002-of-00002.safetensors is missing (model.safetensors.index.json names 2 shards)"
    )


def test_hf_truncated_weights_are_named_with_their_size(tmp_path):
    folder = w.hf_checkpoint(tmp_path, 9)
    w.truncate(folder / "model.safetensors", 0.5)
    assert only(tmp_path).why.startswith("model.safetensors is ")


def test_hf_final_save_model_in_output_dir_is_not_a_checkpoint(tmp_path):
    w.hf_checkpoint(tmp_path, 10)
    w.safetensors_file(tmp_path / "model.safetensors")  # trainer.save_model() into output_dir, after the last save
    f = find_checkpoints(tmp_path)
    assert [c.name for c in f.checkpoints] == ["checkpoint-10"]


def test_deepspeed_latest_names_the_tag(tmp_path):
    w.deepspeed_checkpoint(tmp_path, 100)
    w.deepspeed_checkpoint(tmp_path, 200, latest=False)  # a save that died before `latest` was written
    f = find_checkpoints(tmp_path)
    assert [(c.name, c.layout, c.whole) for c in f.checkpoints] == [
        ("global_step200", Layout.DEEPSPEED, False),
        ("global_step100", Layout.DEEPSPEED, True),
    ]
    assert f.checkpoints[0].why == "newer than global_step100, which latest names (the save did not finish)"
    assert resume_env(f) == {"PODGUARD_RESUME_FROM": str(tmp_path / "global_step100"), "PODGUARD_RESUME_STEP": "100"}


def test_deepspeed_tracker_naming_a_missing_folder(tmp_path):
    w.deepspeed_checkpoint(tmp_path, 100)
    (tmp_path / "latest").write_text("global_step300")
    f = find_checkpoints(tmp_path)
    assert f.checkpoints[0].why == "latest names global_step300, which does not exist"
    assert f.chosen is not None and f.chosen.name == "global_step100"


def test_megatron_tracker_and_a_missing_iteration(tmp_path):
    w.megatron_checkpoint(tmp_path, 1000)
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole, c.name) == (Layout.MEGATRON, 1000, True, "iter_0001000")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2000")
    f = find_checkpoints(tmp_path)
    assert f.checkpoints[0].why == "latest_checkpointed_iteration.txt names iter_0002000, which does not exist"
    assert f.chosen is not None and f.chosen.step == 1000


def test_a_megatron_iteration_the_tracker_named_is_whole_as_it_exists(tmp_path):
    """PRODUCT: `latest_checkpointed_iteration.txt` names an `iter_*` folder that exists (Megatron-LM writes the
    tracker after every rank saved): its files are not judged one by one."""
    (tmp_path / "iter_0000500" / "mp_rank_00").mkdir(parents=True)
    (tmp_path / "iter_0000500" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"placeholder")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("500")
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole, c.name) == (Layout.MEGATRON, 500, True, "iter_0000500")


def test_an_empty_checkpoint_folder_is_dated_by_the_folder_itself(tmp_path):
    (tmp_path / "iter_0000500").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("500")
    c = only(tmp_path)
    assert abs(c.mtime - (tmp_path / "iter_0000500").stat().st_mtime) < 1


def test_a_completed_marker_makes_any_folder_whole(tmp_path):
    folder = tmp_path / "run-a"
    folder.mkdir()
    (folder / "weights.custom").write_text("x")
    assert find_checkpoints(tmp_path).checkpoints == ()  # unknown layout: ignored
    (folder / "COMPLETED").write_text("")
    assert only(tmp_path).whole


def test_the_newest_broken_one_is_skipped_and_named_and_the_older_whole_one_handed_over(tmp_path):
    w.hf_checkpoint(tmp_path, 100)
    w.age(tmp_path / "checkpoint-100", 600)
    newer = w.hf_checkpoint(tmp_path, 200)
    w.truncate(newer / "model.safetensors", 0.3)
    (tmp_path / "notes.txt").write_text("ignored")
    f = find_checkpoints(tmp_path)
    assert [c.name for c in f.skipped] == ["checkpoint-200"]
    assert f.chosen is not None and f.chosen.name == "checkpoint-100"
    lines = resume_lines(f, now=f.chosen.mtime + 600)
    assert lines[0].startswith("skipping checkpoint-200: model.safetensors is ")
    assert lines[1] == f"resuming from {tmp_path / 'checkpoint-100'} (step 100, written 10m ago)"


def test_a_broken_checkpoint_file_is_named_once_in_its_skip_line(tmp_path):
    w.torch_file(tmp_path / "step_100.pt")
    w.age(tmp_path / "step_100.pt", 600)
    w.torch_file(tmp_path / "step_200.pt")
    w.truncate(tmp_path / "step_200.pt", 0.5)
    lines = resume_lines(find_checkpoints(tmp_path), now=0.0)
    assert lines[0] == "skipping step_200.pt: its zip central directory does not read (cut short?)", lines


def test_a_stepless_last_ckpt_written_after_the_others_is_not_the_newest(tmp_path):
    """A `last.ckpt` whose step its metadata does not tell (no `global_step` in it) never outranks one with a step
    (Lightning's own last.ckpt gets its step from its metadata: test_lightning.py)."""
    w.torch_file(tmp_path / "epoch=0-step=10.ckpt")
    w.age(tmp_path / "epoch=0-step=10.ckpt", 100)
    w.torch_file(tmp_path / "last.ckpt")
    f = find_checkpoints(tmp_path)
    assert [c.name for c in f.checkpoints] == ["epoch=0-step=10.ckpt", "last.ckpt"]
    assert resume_env(f) == {
        "PODGUARD_RESUME_FROM": str(tmp_path / "epoch=0-step=10.ckpt"),
        "PODGUARD_RESUME_STEP": "10",
    }


def test_no_checkpoint_yet(tmp_path):
    f = find_checkpoints(tmp_path)
    assert f.chosen is None and resume_env(f) == {}
    assert resume_lines(f, 0.0) == [f"no checkpoint yet in {tmp_path}"]


def _hashes(root: Path) -> dict[str, tuple[str, float, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p)] = (digest, st.st_mtime, st.st_mode)
    return out


def test_nothing_under_dir_is_changed(tmp_path):
    w.hf_checkpoint(tmp_path, 1)
    broken = w.hf_checkpoint(tmp_path, 2, sharded=True)
    (broken / "model-00001-of-00002.safetensors").unlink()
    w.dcp_folder(tmp_path / "step_3")
    w.torch_file(tmp_path / "step-4.pt")
    w.truncate(w.safetensors_file(tmp_path / "step-5.safetensors"), 0.5)
    w.deepspeed_checkpoint(tmp_path, 6)
    before = _hashes(tmp_path)
    find_checkpoints(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "podguard", "checkpoints", str(tmp_path), "--json"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["resume_from"] == str(tmp_path / "global_step6")
    assert _hashes(tmp_path) == before
    assert os.listdir(tmp_path)  # (the listing itself is unchanged: compared above)


# -- found by review: each of these failed before its fix ---------------------------------------------------


@pytest.mark.parametrize("cut", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"])
def test_hf_checkpoint_with_a_truncated_optimizer_or_rng_state_is_not_whole(tmp_path, cut):
    """`resume_from_checkpoint` loads these too: a truncated one fails the resume like truncated weights."""
    w.hf_checkpoint(tmp_path, 100)
    newer = w.hf_checkpoint(tmp_path, 200)
    w.truncate(newer / cut, 0.5)
    f = find_checkpoints(tmp_path)
    assert [c.name for c in f.skipped] == ["checkpoint-200"]
    assert f.skipped[0].why == f"{cut}: its zip central directory does not read (cut short?)"
    assert f.chosen is not None and f.chosen.name == "checkpoint-100"


def test_dcp_folder_being_overwritten_in_place_is_not_whole(tmp_path):
    """DCP keeps the old .metadata until finish() replaces it, and rewrites each shard in place (cut to 0, then
    written): a shard shorter than the old metadata says is a save under way (mtimes are not read: test_dcp.py)."""
    folder = w.dcp_folder(tmp_path / "step_40")
    assert only(tmp_path).whole
    shard = next(folder.glob("*.distcp"))
    w.truncate(shard, 0.25)
    assert only(tmp_path).why.startswith(f"{shard.name} is ")


def test_lightning_last_ckpt_link_is_listed_once_as_its_target(tmp_path):
    """ModelCheckpoint(save_last="link") makes last.ckpt a symlink to the newest checkpoint."""
    w.torch_file(tmp_path / "epoch=0-step=10.ckpt")
    (tmp_path / "last.ckpt").symlink_to("epoch=0-step=10.ckpt")
    f = find_checkpoints(tmp_path)
    assert [(c.name, c.step) for c in f.checkpoints] == [("epoch=0-step=10.ckpt", 10)]


def test_symlink_loops_dangling_links_and_fifos_neither_hang_nor_crash(tmp_path):
    w.torch_file(tmp_path / "step-1.pt")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "self").symlink_to(".")
    (tmp_path / "step-9.pt").symlink_to("nowhere.pt")
    os.mkfifo(tmp_path / "step-5.pt")  # opening a FIFO to read its header would block forever
    (tmp_path / "checkpoint-7").mkdir()
    (tmp_path / "checkpoint-7" / "up").symlink_to("..")
    os.mkfifo(tmp_path / "checkpoint-7" / "trainer_state.json")
    code = f"from podguard.checkpoints import find_checkpoints; print(find_checkpoints({str(tmp_path)!r}).chosen.name)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert proc.stdout.strip() == "step-1.pt", proc.stderr


def test_a_few_bytes_short_is_said_in_bytes(tmp_path):
    path = w.safetensors_file(tmp_path / "x.safetensors", size=1024)
    size = path.stat().st_size
    w.truncate(path, (size - 1) / size)
    assert safetensors_why(str(path)) == f"x.safetensors is {size - 1:,} bytes of {size:,}"


def _rchar() -> int:
    with open("/proc/self/io", "rb", buffering=0) as f:
        return int(f.read().split(b"rchar:")[1].split()[0])


def test_a_restart_judges_only_until_the_newest_whole_checkpoint(tmp_path):
    """A long run's trainer_state.json is megabytes of log_history: judging 1,000 of them would take seconds
    before every attempt and on every poll of the save wait."""
    for step in range(1, 21):
        folder = w.hf_checkpoint(tmp_path, step)
        log = [{"loss": 1.0, "step": i} for i in range(10_000)]  # ~200 KB
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": log}))
    before = _rchar()
    f = find_checkpoints(tmp_path, until_whole=True)
    got = _rchar() - before
    assert [c.name for c in f.checkpoints] == ["checkpoint-20"] and len(f.keys) == 20
    assert got < 1_000_000  # one trainer_state.json (and headers), not twenty
    assert len(find_checkpoints(tmp_path, skip=f.keys).checkpoints) == 0


@pytest.mark.parametrize("target", ["step-5.pt", "step_6"])
def test_a_latest_symlink_is_no_deepspeed_tracker(tmp_path, target):
    """A user's `latest -> step-5.pt` is not DeepSpeed's tracker file: its bytes name no tag folder."""
    w.torch_file(tmp_path / "step-5.pt")
    w.dcp_folder(tmp_path / "step_6")
    (tmp_path / "latest").symlink_to(target)
    f = find_checkpoints(tmp_path)
    assert [(c.name, c.layout, c.whole) for c in f.checkpoints] == [
        ("step_6", Layout.DCP, True),
        ("step-5.pt", Layout.TORCH, True),
    ]


def test_a_data_set_beside_the_checkpoints_is_not_walked(tmp_path, monkeypatch):
    """DIR = /workspace with a data set in it: one listing of `data/`, not a walk of its files (on a network
    volume each stat is a round trip, before every attempt and every poll of the save wait)."""
    w.torch_file(tmp_path / "step-1.pt")
    for a in range(5):
        for b in range(5):
            (tmp_path / "data" / f"shard{a}" / f"part{b}").mkdir(parents=True)
    listed: list[str] = []
    real = os.scandir

    def counting(path="."):
        listed.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    f = find_checkpoints(tmp_path)
    assert f.chosen is not None and f.chosen.name == "step-1.pt"
    assert sorted(listed) == [str(tmp_path), str(tmp_path / "data")]


def test_accelerate_save_state_named_checkpoint_n_as_the_diffusers_scripts_do(tmp_path):
    """`accelerator.save_state(f"{out}/checkpoint-{step}")` has no trainer_state.json: it is accelerate's layout,
    whole once random_states_0.pkl (written last) is."""
    pytest.importorskip("accelerate")
    folder = w.accelerate_state(tmp_path / "checkpoint-500")
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(os.listdir(folder))
    c = only(tmp_path)
    assert (c.layout, c.step, c.whole) == (Layout.ACCELERATE, 500, True)
    w.truncate(folder / "random_states_0.pkl", 0.5)
    assert only(tmp_path).why == "random_states_0.pkl: its zip central directory does not read (cut short?)"
    (folder / "random_states_0.pkl").unlink()
    assert only(tmp_path).why == "no random_states_0.pkl (accelerate writes it last: the save did not finish)"

"""torch Distributed Checkpoint folders, saved by the real `torch.distributed.checkpoint`: whole once `.metadata`
exists and every file it names is there and long enough, a rule that holds for a copy (`cp -r`, a download in
name order), whose mtimes mean nothing; a copy or a save still under way is not whole, and says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import writers as w

from podguard.checkpoints import Layout, find_checkpoints
from podguard.checkpoints.checkpoint import short_of
from podguard.checkpoints.dcp import dcp_files

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")


def only(root: Path):
    (c,) = find_checkpoints(root).checkpoints
    return c


def save(path: Path, *, per_item: bool = False, n: int = 3) -> Path:
    """A real DCP save: one shard file (the default), or one file per item (`single_file_per_rank=False`)."""
    state = {"model": {f"layer{i}.weight": torch.full((64,), float(i)) for i in range(n)}, "step": 7}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no process group: DCP says it saves in a single process)
        writer = dcp.FileSystemWriter(str(path), single_file_per_rank=not per_item)
        dcp.save(state, storage_writer=writer)
    return path


def shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.distcp"))


def stamp_in_name_order(folder: Path) -> None:
    """mtimes as a copy in name order leaves them: `.metadata` first, every shard after it."""
    t = time.time() - 100
    for i, p in enumerate(sorted(folder.iterdir(), key=lambda p: p.name)):
        os.utime(p, (t + i, t + i))


def test_the_metadata_names_every_shard_and_how_long_it_is(tmp_path):
    folder = save(tmp_path / "step_40", per_item=True)
    files = dcp_files(str(folder / ".metadata"))
    assert sorted(files) == sorted(p.name for p in shards(folder))
    for name, end in files.items():
        assert 0 < end <= (folder / name).stat().st_size  # (the last item ends where the file ends)


@pytest.mark.parametrize("copy", ["cp -r", "name order"])
def test_a_copy_whose_mtimes_mean_nothing_is_whole(tmp_path, copy):
    """`cp -r`, `rsync` without `-t`, a download in name order: the shards come out newer than `.metadata`."""
    original = save(tmp_path / "orig" / "step_40", per_item=True)
    dest = tmp_path / "copy"
    dest.mkdir()
    if copy == "cp -r":
        subprocess.run(["cp", "-r", str(original), str(dest)], check=True)
    else:
        (dest / "step_40").mkdir()
        for p in sorted(original.iterdir(), key=lambda p: p.name):
            shutil.copyfile(p, dest / "step_40" / p.name)
    stamp_in_name_order(dest / "step_40")
    meta = (dest / "step_40" / ".metadata").stat().st_mtime
    assert all(p.stat().st_mtime > meta for p in shards(dest / "step_40"))
    c = only(dest)
    assert (c.layout, c.step, c.whole, c.why) == (Layout.DCP, 40, True, "")


def test_a_copy_under_way_is_not_whole_a_shard_cut_short(tmp_path):
    folder = save(tmp_path / "step_40", per_item=True)
    last = shards(folder)[-1]
    size = last.stat().st_size
    w.truncate(last, 0.5)
    assert only(tmp_path).why == f"{last.name} is {short_of(size // 2, size)} (.metadata names 4 files)"


def test_a_copy_under_way_is_not_whole_a_shard_not_there_yet(tmp_path):
    folder = save(tmp_path / "step_40", per_item=True)
    name = shards(folder)[-1].name
    (folder / name).unlink()
    assert only(tmp_path).why == f"{name} is missing (.metadata names 4 files)"


def test_a_save_into_the_same_folder_is_not_whole_while_it_rewrites_a_shard(tmp_path):
    """DCP's default `overwrite=True` rewrites each shard in place (opened "wb": cut to 0, then written): the old
    `.metadata` names a length the shard does not have yet."""
    folder = save(tmp_path / "latest")
    (shard,) = shards(folder)
    size = shard.stat().st_size
    shard.write_bytes(b"")  # what open(shard, "wb") leaves before the first item is written
    assert only(tmp_path).why == f"{shard.name} is {short_of(0, size)} (.metadata names 1 file)"


def test_a_save_finishing_its_metadata_is_not_whole(tmp_path):
    """`finish()` pickles the new metadata into `.metadata.tmp` and then renames it over `.metadata`: while the
    `.tmp` is there, the shards are the new save's and `.metadata` the old one's (or a crash left them so)."""
    folder = save(tmp_path / "latest")
    shutil.copyfile(folder / ".metadata", folder / ".metadata.tmp")
    assert only(tmp_path).why == ".metadata.tmp is there: a save into this folder did not finish"


def test_without_metadata_the_save_did_not_finish(tmp_path):
    folder = save(tmp_path / "step_40")
    (folder / ".metadata").unlink()
    assert only(tmp_path).why == "no .metadata (torch DCP writes it last: the save did not finish)"


def test_a_metadata_cut_short_is_not_whole(tmp_path):
    folder = save(tmp_path / "step_40")
    w.truncate(folder / ".metadata", 0.5)
    assert only(tmp_path).why == ".metadata does not read (cut short?)"


def test_a_metadata_that_is_no_dcp_metadata_is_not_whole(tmp_path):
    folder = save(tmp_path / "step_40")
    (folder / ".metadata").write_bytes(b"\x80\x04K\x01.")  # a pickle of the number 1
    assert only(tmp_path).why == ".metadata names no files (not torch DCP metadata?)"


def test_reading_the_metadata_runs_no_code_from_it(tmp_path):
    """`.metadata` is a pickle: podguard reads it with an unpickler that builds no class and calls no function
    it names, so a hostile file cannot run code (and torch is never imported)."""
    import pickle

    folder = save(tmp_path / "step_40")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    assert only(tmp_path).why == ".metadata names no files (not torch DCP metadata?)"
    assert not marker.exists()


def test_rank_local_metadata_without_collectives(tmp_path):
    """`dcp.save(..., use_collectives=False)` under a process group: each rank writes `__<rank>.metadata` for its
    own `__<rank>_*.distcp` files; a rank whose metadata is missing did not finish."""
    root = tmp_path / "ckpt"
    folder = root / "step_9"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        one = save(tmp_path / f"r{rank}")
        (one / "__0_0.distcp").rename(folder / f"__{rank}_0.distcp")
        data = (one / ".metadata").read_bytes().replace(b"__0_0.distcp", f"__{rank}_0.distcp".encode())
        (folder / f"__{rank}.metadata").write_bytes(data)
    c = only(root)
    assert (c.layout, c.whole) == (Layout.DCP, True), c.why
    (folder / "__1.metadata").unlink()
    assert only(root).why == "no __1.metadata for __1_0.distcp (rank 1's save did not finish)"


TWO_RANKS = """
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
model = torch.nn.parallel.DistributedDataParallel(model)
optim = torch.optim.AdamW(model.parameters())
model(torch.randn(8, 64)).sum().backward()
optim.step()
model_state, optim_state = get_state_dict(model, optim)
dcp.save({"model": model_state, "optim": optim_state, "step": 40}, checkpoint_id=sys.argv[3])
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_two_rank_save_with_gloo_is_whole_and_a_rank_file_missing_is_named(tmp_path):
    """Two real ranks (gloo): DCP writes one file per rank that has items to write, and `.metadata` names each."""
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    folder = tmp_path / "ckpt" / "step_40"
    store = tmp_path / "store"
    procs = [
        subprocess.Popen([sys.executable, str(script), str(rank), str(store), str(folder)], stderr=subprocess.PIPE)
        for rank in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
    files = dcp_files(str(folder / ".metadata"))
    assert sorted(files) == sorted(p.name for p in shards(folder)) and files
    c = only(tmp_path / "ckpt")
    assert (c.layout, c.step, c.whole) == (Layout.DCP, 40, True)
    last = sorted(files)[-1]
    (folder / last).unlink()
    assert (
        only(tmp_path / "ckpt").why == f"{last} is missing (.metadata names {len(files)} file{'s' * (len(files) > 1)})"
    )

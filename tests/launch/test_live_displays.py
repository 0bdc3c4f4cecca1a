"""Live displays (issue 30, items 6 and 7): a redraw is progress only when its counts change. A stalled loop under a
rich `Progress` whose elapsed and remaining columns tick, or under `console.status()`'s spinner, is hung; so is a
stalled `track()` in torchrun mode, where the rank wrapper's `rank0:` prefix stood before the redraw's erase. A
display whose counts move is progress. Real rich under `podguard run|train` on CPU; the printer's rules alone
below."""

from __future__ import annotations

import importlib.util
import io
import math
import sys
import time
from pathlib import Path

import pytest

from jobproc import run_podguard, script
from loadfactor import load_factor
from podguard.launch.lines import FRAME_START, HIDDEN, Redraws, line_key
from podguard.launch.printer import Printer

needs_rich = pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="rich is not installed")

PROGRESS_CLOCKS = """
    import time
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    columns = (SpinnerColumn(), TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("train", total=100)
        for i in range(100):
            progress.advance(task)
            time.sleep(0.3 if i < STALL_AT else 90)
    """
STATUS_SPINNER = """
    import time
    from rich.console import Console
    console = Console()
    for i in range(100):
        with console.status(f"step {i}: working"):
            time.sleep(0.3 if i < STALL_AT else 90)
    """
TRACK = """
    import time
    from rich.progress import track
    for i in track(range(100), description="train"):
        time.sleep(0.3 if i < STALL_AT else 90)
    """


@pytest.mark.slow
@needs_rich
@pytest.mark.parametrize(
    ("body", "mode"),
    [(PROGRESS_CLOCKS, "run"), (STATUS_SPINNER, "run"), (TRACK, "torchrun"), (PROGRESS_CLOCKS, "torchrun")],
    ids=["progress-clocks", "status-spinner", "track-torchrun", "progress-clocks-torchrun"],
)
def test_a_stalled_loop_under_a_live_display_that_keeps_redrawing_is_hung(tmp_path: Path, cli_node, body, mode):
    job = script(tmp_path, "live.py", body.replace("STALL_AT", "3"))
    args = ["run"] if mode == "run" else ["train", "--mode", "torchrun", "--cpu-workers", "1"]
    started = time.monotonic()
    proc = run_podguard(
        cli_node, [*args, "--hang-timeout", "5", "--grace", "1", "--", sys.executable, job], cpu=True, timeout=150
    )
    assert proc.returncode == 79, (proc.stdout + proc.stderr)[-3000:]
    assert time.monotonic() - started < 5 + 60 + 30  # (the job itself would have slept 90 s)


@pytest.mark.slow
@needs_rich
@pytest.mark.parametrize("mode", ["run", "torchrun"])
def test_a_live_display_whose_counts_move_is_progress(tmp_path: Path, cli_node, mode):
    # torchrun's agent imports torch first: its start-up is silent, and the hang timeout must cover it (8 s on an
    # idle machine, stretched by the load factor); the display then runs longer than that timeout, stretched
    # alike (30 steps of 0.3 s on an idle machine), or a display that is not progress would pass unnoticed
    factor = 1.0 if mode == "run" else load_factor()
    steps = f"range({math.ceil(30 * factor)})"
    job = script(tmp_path, "live.py", PROGRESS_CLOCKS.replace("STALL_AT", "1000").replace("range(100)", steps))
    args = ["run"] if mode == "run" else ["train", "--mode", "torchrun", "--cpu-workers", "1"]
    hang = "4" if mode == "run" else f"{8 * factor:.1f}"
    proc = run_podguard(
        cli_node, [*args, "--hang-timeout", hang, "--grace", "1", "--", sys.executable, job], cpu=True, timeout=150
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


# ---------------------------------------------------------------------------------------------------------------
# the rules alone

SPIN = ["⠋", "⠙", "⠹", "⠸"]


def _frame(spin: str, done: int, clock: str, prefix: bytes = b"") -> bytes:
    body = f"\x1b[32m{spin}\x1b[0m train \x1b[91m━━━━\x1b[0m {done}/10 \x1b[33m{clock}\x1b[0m \x1b[36m-:--:--\x1b[0m"
    return prefix + b"\r" + FRAME_START + body.encode()


def test_a_line_s_key_leaves_out_its_clocks_spinner_and_colours() -> None:
    assert (
        line_key(_frame("⠋", 3, "0:00:12")[1:])
        == line_key(_frame("⠹", 3, "0:01:07")[1:])
        == (
            b"train",
            "━━━━".encode(),
            b"3/10",
        )
    )
    assert line_key(b"| loading shards") == (b"loading", b"shards")
    assert line_key(b"step 12 loss 0.25 12:30") == (b"step", b"12", b"loss", b"0.25")


def test_redraws_whose_only_change_is_a_clock_or_a_spinner_are_not_lines(tmp_path: Path) -> None:
    out = io.BytesIO()
    p = Printer(out)
    s = p.add("job", None, log_path=tmp_path / "job.log")
    seen: list[str] = []
    p.watch_all(lambda name, line: seen.append(line))
    frames = [_frame(SPIN[i % 4], 3, f"0:00:{10 + i:02d}") for i in range(30)]  # stalled: spinner and clock move
    frames += [_frame(SPIN[0], 4, "0:00:40")]  # a count moved
    for frame in frames:
        p.feed(s, frame)
    p.feed(s, b"\n")
    p.close(s)
    p.finish()
    assert [line.split()[3] for line in seen] == ["3/10", "4/10"]


def test_redraws_behind_a_rank_prefix_are_told_apart_per_rank() -> None:
    """torchrun mode: the rank wrapper cuts each redraw into a line `rank0:ESC[2K...`; two ranks' displays
    interleave in one stream, a hidden rank's lines carry HIDDEN before the prefix."""
    redraws = Redraws()
    lines = b""
    for i in range(20):
        for prefix, done in ((b"rank0:", 3 + (i == 19)), (HIDDEN + b"rank1:", 5)):
            lines += _frame(SPIN[i % 4], done, f"0:00:{i:02d}", prefix).replace(b"\r", b"") + b"\n"
    lines += b"rank0:step done\n"
    kept = redraws.filter(lines).decode().splitlines()
    assert [ln.split()[3] if "train" in ln else ln for ln in kept] == ["3/10", "5/10", "4/10", "rank0:step done"]

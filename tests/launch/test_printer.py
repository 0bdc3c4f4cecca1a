"""The output multiplexer: whole lines, prefixes, '\\r', long lines, partial last lines, filters, logs; issue 23:
hidden lines reach the logs and watchers, cursor moves, a raw terminal for a lone worker, torch elastic's
SignalException condensed, the first error as the root cause, bytes without line ends as activity."""

from __future__ import annotations

import io
import os
import select
import sys
import time
from pathlib import Path

import pytest

from loadfactor import scaled
from podguard.launch.errorlines import FirstError
from podguard.launch.lines import HIDDEN
from podguard.launch.printer import CONT_END, CONT_START, LINE_CAP, Printer
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec


def _printer(**kw):
    out = io.BytesIO()
    return Printer(out, **kw), out


def _shown(master: int, expected: bytes, within_s: float = 10.0) -> bytes:
    """What the terminal shows, read until it ends as `expected` does or `within_s` passes: a pty hands the
    writes over through the kernel's workqueue, so one read right after them may see only the first."""
    shown, deadline = b"", time.monotonic() + scaled(within_s)
    while not shown.endswith(expected) and select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
        shown += os.read(master, 65536)
    return shown


def _feed_all(printer, stream, pieces):
    for piece in pieces:
        printer.feed(stream, piece)
    printer.close(stream)
    printer.flush()


def test_partial_writes_become_whole_prefixed_lines():
    p, out = _printer()
    s = p.add("GPU0", None, prefix="GPU0:")
    _feed_all(p, s, [b"hel", b"lo\nwor", b"ld\n", b"\n", b"last"])
    assert out.getvalue() == b"GPU0:hello\nGPU0:world\nGPU0:\nGPU0:last\n"


def test_carriage_returns_end_lines_and_crlf_counts_once():
    p, out = _printer()
    s = p.add("w", None, prefix="W:")
    # tqdm style (each redraw starts with \r), a CRLF split across two reads, a run of \r
    pieces = [b"\r 10%", b"\r 20%", b"\r 30%\n", b"dos\r", b"\nunix\n", b"a\r\r\rb\r\n", b"crlf\r\n\r", b"\nend\r"]
    _feed_all(p, s, pieces)
    expected = [b" 10%", b" 20%", b" 30%", b"dos", b"unix", b"a", b"b", b"crlf", b"", b"end", b""]
    assert out.getvalue().split(b"\n") == [b"W:" + x for x in expected[:-1]] + [b""]


def test_long_line_is_cut_with_markers_and_nothing_lost(tmp_path: Path):
    line = ("é" * 50_000 + "x" * 70_000).encode()  # 170 KB, multibyte characters across the cuts
    p, out = _printer()
    s = p.add("w", None, prefix="P:", log_path=tmp_path / "w.log")
    pieces = [line[i : i + 7000] for i in range(0, len(line), 7000)]  # never a newline until the end
    _feed_all(p, s, [*pieces, b"\nshort\n"])
    lines = out.getvalue().split(b"\n")[:-1]
    assert lines[-1] == b"P:short"
    chunks = lines[:-1]
    assert len(chunks) >= 3
    assert all(len(c) <= LINE_CAP + len(b"P:") for c in chunks)
    assert all(c.endswith(CONT_END) for c in chunks[:-1])
    assert all(c.startswith(b"P:" + CONT_START) for c in chunks[1:])
    for c in chunks:
        c.decode("utf-8")  # never cut inside a character
    rebuilt = b"".join(c[2:].removeprefix(CONT_START).removesuffix(CONT_END) for c in chunks)
    assert rebuilt == line
    log = (tmp_path / "w.log").read_bytes()
    assert log.endswith(b"\nshort\n") and CONT_END in log and not log.startswith(b"P:")


def test_long_lines_inside_one_big_read_are_cut():
    big = b"a" * (3 * LINE_CAP) + b"\n" + b"b" * 10 + b"\n"
    p, out = _printer()
    s = p.add("w", None)
    _feed_all(p, s, [big])
    lines = out.getvalue().split(b"\n")[:-1]
    assert lines[-1] == b"b" * 10
    assert max(len(x) for x in lines) <= LINE_CAP
    assert b"".join(x.removeprefix(CONT_START).removesuffix(CONT_END) for x in lines[:-1]) == b"a" * (3 * LINE_CAP)


def test_only_filter_hides_from_terminal_but_logs_everything(tmp_path: Path):
    p, out = _printer(only={"GPU1"})
    a = p.add("GPU0", None, prefix="GPU0:", log_path=tmp_path / "GPU0.log")
    b = p.add("GPU1", None, prefix="GPU1:", log_path=tmp_path / "GPU1.log")
    p.feed(a, b"zero\n")
    p.feed(b, b"one\n")
    p.message("podguard: note")
    p.close_all()
    assert out.getvalue() == b"GPU1:one\npodguard: note\n"
    assert (tmp_path / "GPU0.log").read_bytes() == b"zero\n"
    assert (tmp_path / "GPU1.log").read_bytes() == b"one\n"


def test_tail_and_line_watchers():
    seen = []
    p, _ = _printer(on_line=lambda name, line: seen.append((name, line)), tail_lines=3)
    s = p.add("w", None)
    p.feed(s, b"".join(b"line %d\n" % i for i in range(100)) + b"partial")
    assert p.tail("w") == ("line 98", "line 99", "partial")
    p.close(s)
    assert p.tail("w") == ("line 98", "line 99", "partial")
    assert seen[0] == ("w", "line 0") and seen[-1] == ("w", "partial") and len(seen) == 101


# --------------------------------------------------------------------------------------------------
# Real processes

_GEN = r"""
import os, random, sys
def bodies(rank, n):
    rnd = random.Random(rank)
    pool = [b"x" * k for k in range(120)]
    return [b"w%d %d %s" % (rank, i, pool[rnd.randrange(120)]) for i in range(n)]
"""

_FLOOD = (
    _GEN
    + r"""
rank, n = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(-rank)
ends = [b"\n"] * 8 + [b"\r", b"\r\n"]  # '\r' and '\r\n' end lines too
data = b"".join(body + ends[i % 10] for i, body in enumerate(bodies(rank, n)))
pos = 0
while pos < len(data):  # partial writes: chunk boundaries fall anywhere, inside lines and '\r\n'
    step = rnd.randrange(1, 30000)
    os.write(1, data[pos:pos + step])
    pos += step
"""
)


def test_eight_floods_of_100k_lines_arrive_whole_prefixed_and_complete(tmp_path: Path):
    workers, per_worker = 8, 100_000
    specs = [
        WorkerSpec(
            f"GPU{r}",
            (sys.executable, "-c", _FLOOD, str(r), str(per_worker)),
            prefix=f"GPU{r}:",
            log_path=tmp_path / f"GPU{r}.log",
        )
        for r in range(workers)
    ]
    out_path = tmp_path / "out.txt"
    with out_path.open("wb") as out:
        outcome = run_job(specs, terminal=out, summary=False)
    assert outcome.exit_code == 0
    namespace: dict = {}
    exec(_GEN, namespace)
    buckets: dict[bytes, list[bytes]] = {}
    for line in out_path.read_bytes().split(b"\n")[:-1]:  # one cheap step per line: group by prefix
        buckets.setdefault(line[:5], []).append(line)
    assert sorted(buckets) == [b"GPU%d:" % r for r in range(workers)]  # no line without its prefix
    for r in range(workers):
        expected = namespace["bodies"](r, per_worker)
        got = buckets[b"GPU%d:" % r]
        assert len(got) == per_worker  # none lost, none split
        assert got == [b"GPU%d:" % r + body for body in expected]  # each whole, in order
        if r == 3:
            assert (tmp_path / "GPU3.log").read_bytes() == b"\n".join(expected) + b"\n"


def test_worker_dying_mid_line_still_has_its_partial_line_printed(tmp_path: Path):
    code = "import os,signal\nos.write(1,b'first\\nhalf a li')\nos.kill(os.getpid(), signal.SIGKILL)"
    out_path = tmp_path / "out.txt"
    with out_path.open("wb") as out:
        outcome = run_job([WorkerSpec("GPU0", (sys.executable, "-c", code), prefix="GPU0:")], terminal=out)
    text = out_path.read_bytes()
    assert b"GPU0:first\nGPU0:half a li\n" in text
    assert outcome.exit_code == 128 + 9
    assert outcome.root_cause is not None and outcome.root_cause.tail[-1] == "half a li"


@pytest.mark.parametrize("data", [b"", b"\n", b"\r", b"\r\n\r\n"])
def test_degenerate_inputs(data):
    p, out = _printer()
    s = p.add("w", None, prefix="P:")
    _feed_all(p, s, [data])
    assert all(line.startswith(b"P:") for line in out.getvalue().split(b"\n")[:-1])


def test_text_stream_without_a_file_descriptor():
    out = io.StringIO()
    p = Printer(out)
    s = p.add("w", None, prefix="GPU0:")
    p.feed(s, "héllo\n".encode())
    p.flush()
    assert out.getvalue() == "GPU0:héllo\n"


# ---------------------------------------------------------------------------------------------------------------
# Issue 23: hidden lines still reach the logs and the watchers; cursor moves; raw terminal; tracebacks; activity.


def test_lines_marked_hidden_skip_the_terminal_but_reach_the_log_and_the_watchers(tmp_path: Path):
    """The torchrun rank wrapper marks the lines of ranks `--only-gpu` hides (it used to drop them: a false hang)."""
    p, out = _printer()
    s = p.add("torchrun", None, log_path=tmp_path / "torchrun.log")
    seen: list[str] = []
    p.watch_all(lambda name, line: seen.append(line))
    _feed_all(p, s, [b"rank0:a\n" + HIDDEN + b"rank1:b\n", HIDDEN + b"rank1:c\n", b"rank0:d\n"])
    p.finish()
    assert out.getvalue() == b"rank0:a\nrank0:d\n"
    assert seen == ["rank0:a", "rank1:b", "rank1:c", "rank0:d"]
    assert (tmp_path / "torchrun.log").read_bytes() == b"rank0:a\nrank1:b\nrank1:c\nrank0:d\n"


def test_cursor_moves_are_dropped_once_redraws_are_lines_and_colours_stay():
    p, out = _printer()
    p._colour = True  # colours stay on a person's terminal (a tty: here a BytesIO standing in for one)
    s = p.add("job", None)
    # tqdm's nested bars go up with ESC[A; rich erases with ESC[2K and hides the cursor
    _feed_all(p, s, [b"\r 10%\r 20%\x1b[A\n", b"\x1b[?25l\r\x1b[2K\x1b[1A\x1b[2K\x1b[32mok\x1b[0m\n", b"\x1b[A\n"])
    assert out.getvalue() == b" 10%\n 20%\n\x1b[32mok\x1b[0m\n"


def test_a_lone_worker_on_a_terminal_redraws_in_place_and_its_log_gets_lines(tmp_path: Path):
    """Single mode, one worker, a real terminal: its '\\r' redraws pass through raw (they used to become lines);
    the log file and the watchers get whole lines, without cursor moves."""
    master, slave = os.openpty()
    try:
        p = Printer(slave)
        s = p.add("job", None, log_path=tmp_path / "job.log")
        _feed_all(p, s, [b"epoch 1\n", b"\r 10%", b"\r 20%\x1b[A", b"\r 30%\n"])
        p.message("podguard: done")
        p.finish()
        shown = _shown(master, b"epoch 1\r\n\r 10%\r 20%\x1b[A\r 30%\r\npodguard: done\r\n")
    finally:
        os.close(master)
        os.close(slave)
    # (the pty turns \n into \r\n)
    assert shown == b"epoch 1\r\n\r 10%\r 20%\x1b[A\r 30%\r\npodguard: done\r\n"
    assert (tmp_path / "job.log").read_bytes() == b"epoch 1\n 10%\n 20%\n 30%\n"


def test_a_raw_terminal_line_left_open_is_ended_before_podguards_line():
    master, slave = os.openpty()
    try:
        p = Printer(slave)
        s = p.add("job", None)
        p.feed(s, b"\r 10%")
        p.message("podguard: HUNG")
        p.flush()
        p.finish()
        shown = _shown(master, b"\r 10%\r\npodguard: HUNG\r\n")
    finally:
        os.close(master)
        os.close(slave)
    assert shown == b"\r 10%\r\npodguard: HUNG\r\n"


def test_a_raw_workers_last_partial_line_is_not_shown_twice_at_its_end(tmp_path: Path):
    master, slave = os.openpty()
    try:
        p = Printer(slave)
        s = p.add("job", None, log_path=tmp_path / "job.log")
        _feed_all(p, s, [b"\r 10%", b"\r 20%"])  # it died mid-bar
        p.finish()
        shown = _shown(master, b"\r 10%\r 20%\r\n")
    finally:
        os.close(master)
        os.close(slave)
    assert shown == b"\r 10%\r 20%\r\n"
    assert (tmp_path / "job.log").read_bytes() == b" 10%\n 20%\n"


TORCH_SIGNAL_TRACEBACK = b"""W1127 api.py:753] Received 15 death signal, shutting down workers
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 12000 got signal: 15
"""


def test_torch_elastics_signal_traceback_is_one_terminal_line_and_whole_in_the_log(tmp_path: Path):
    p, out = _printer()
    s = p.add("torchrun", None, log_path=tmp_path / "torchrun.log")
    other = b"Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: boom\n"
    _feed_all(p, s, [other, TORCH_SIGNAL_TRACEBACK[:150], TORCH_SIGNAL_TRACEBACK[150:]])
    p.finish()
    assert out.getvalue() == other + (
        b"W1127 api.py:753] Received 15 death signal, shutting down workers\n"
        b"torch elastic stopped by signal 15 (its SignalException traceback: in the log file)\n"
    )
    assert (tmp_path / "torchrun.log").read_bytes() == other + TORCH_SIGNAL_TRACEBACK


def test_a_traceback_cut_by_the_end_of_the_stream_is_still_shown():
    p, out = _printer()
    s = p.add("torchrun", None)
    _feed_all(p, s, [b"Traceback (most recent call last):\n  File 'x.py', line 1\n"])
    assert out.getvalue() == b"Traceback (most recent call last):\n  File 'x.py', line 1\n"


def test_bytes_without_a_line_end_are_reported_as_activity():
    p, _ = _printer()
    s = p.add("job", None)
    seen: list[str] = []
    p.watch_activity(seen.append)
    p.feed(s, b".")
    p.feed(s, b".")
    p.feed(s, b"")
    assert seen == ["job", "job"]


# Two ranks in one pipe (single mode: the framework starts them): rank 0 raises first, rank 1 then fails on the
# closed connection and prints a long traceback and more lines: the summary's root cause is rank 0's error.
TWO_RANKS = r"""
import subprocess, sys, time
first = '''
import time
time.sleep(0.2)
def train_step():
    raise ValueError("rank 0: loss is NaN at step 3")
train_step()
'''
second = '''
import sys, time
time.sleep(0.8)
print("Traceback (most recent call last):", file=sys.stderr)
for i in range(30):
    print(f'  File "/venv/torch/distributed/c10d.py", line {i}, in wait', file=sys.stderr)
print("RuntimeError: Connection closed by peer [127.0.0.1]:29500", file=sys.stderr)
for i in range(25):
    print(f"rank 1: shutting down {i}")
sys.exit(1)
'''
procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (first, second)]
sys.exit(max(p.wait() for p in procs))
"""


def test_the_root_cause_of_ranks_sharing_one_pipe_is_the_first_error_by_time():
    out = io.BytesIO()
    outcome = run_job([WorkerSpec("job", (sys.executable, "-c", TWO_RANKS))], terminal=out)
    assert outcome.exit_code == 1
    assert outcome.root_cause is not None
    assert outcome.root_cause.first_error[-1] == "ValueError: rank 0: loss is NaN at step 3"
    said = out.getvalue().decode()
    summary = said[said.index("podguard: ") :]  # (the job's own lines come first)
    lead = summary.index("first error in the output of job: ValueError: rank 0: loss is NaN at step 3")
    assert lead < summary.index("rank 1: shutting down 24")  # it leads; the last lines follow
    assert "Connection closed by peer" not in summary[lead : summary.index("last ")]


def test_the_log_file_watchers_and_tail_get_plain_text_while_the_terminal_keeps_colours(tmp_path: Path):
    """rich under TTY_COMPATIBLE colours numbers and links its log lines (OSC 8); a hidden rank's line too."""
    p, out = _printer()
    p._colour = True  # a person's terminal (a tty: here a BytesIO standing in for one)
    s = p.add("job", None, log_path=tmp_path / "job.log")
    seen: list[str] = []
    p.watch_all(lambda name, line: seen.append(line))
    link = b"\x1b]8;id=1;file:///x.py\x1b\\x.py\x1b]8;;\x1b\\"
    coloured = b"step \x1b[1;36m5\x1b[0m " + link + b"\n"
    _feed_all(p, s, [coloured, b"\x1b[0m\n", HIDDEN + b"rank1: \x1b[31mboom\x1b[0m\n"])
    p.finish()
    assert out.getvalue() == coloured + b"\x1b[0m\n"
    assert seen == ["step 5 x.py", "rank1: boom"]
    assert (tmp_path / "job.log").read_bytes() == b"step 5 x.py\nrank1: boom\n"
    assert p.tail("job") == ("step 5 x.py", "rank1: boom")


def test_a_redraw_that_repeats_the_last_one_is_not_a_line(tmp_path: Path):
    """rich's refresh thread redraws a stalled bar 10 times a second (`\\r ESC[2K` then the frame): a repeat is
    neither a log line nor activity; a frame that moved, or a line printed above the bar, is."""
    p, out = _printer()
    s = p.add("job", None, log_path=tmp_path / "job.log")
    seen: list[str] = []
    p.watch_all(lambda name, line: seen.append(line))
    two_lines = b"\r\x1b[2K\x1b[1A\x1b[2Kep 0 3/9\nloss 1"
    _feed_all(p, s, [b"\x1b[?25lep 0 3/9\nloss 1", two_lines * 5, b"\r\x1b[2K\x1b[1A\x1b[2Kloaded\nep 0 3/9\nloss 1"])
    p.finish()
    assert seen == ["ep 0 3/9", "loss 1", "ep 0 3/9", "loss 1", "loaded", "ep 0 3/9", "loss 1"]
    assert out.getvalue().decode().splitlines() == seen


def _traceback(error: str) -> bytes:
    return f'Traceback (most recent call last):\n  File "train.py", line 9, in step\n{error}\n'.encode()


def test_a_traceback_the_job_outlived_is_not_its_root_cause():
    """A handled error printed with its traceback (a retried download), then a minute of training: the crash an
    hour later is the first error, not the retry (was: the retry's traceback led the failure summary)."""
    first = FirstError()
    first.feed(_traceback("ConnectionError: hub.example: timed out"))
    for second in range(0, 70, 5):  # training output for 70 s after it
        first.went_on(1000.0 + second)
    first.feed(b"step 900 loss 0.4\n" + _traceback("torch.OutOfMemoryError: CUDA out of memory"))
    assert first.lines[-1] == "torch.OutOfMemoryError: CUDA out of memory"
    # ranks failing one after the other (seconds), or stuck ranks timing out later (silence, then a burst): kept
    cascade = FirstError()
    cascade.feed(_traceback("ValueError: rank 0: loss is NaN"))
    for now in (5.0, 6.0, 605.0, 606.0):
        cascade.went_on(now)
    cascade.feed(_traceback("RuntimeError: Connection closed by peer"))
    assert cascade.lines[-1] == "ValueError: rank 0: loss is NaN"


def test_a_terminal_that_is_a_pipe_gets_plain_text(tmp_path: Path):
    """Container logs (RunPod's log view, `docker logs`) are podguard's stdout on a pipe: no escape codes there."""
    p, out = _printer()
    s = p.add("job", None, log_path=tmp_path / "job.log")
    _feed_all(p, s, [b"step \x1b[1;36m5\x1b[0m\n", HIDDEN + b"rank1: \x1b[31mboom\x1b[0m\n"])
    p.finish()
    assert out.getvalue() == b"step 5\n"
    assert (tmp_path / "job.log").read_bytes() == b"step 5\nrank1: boom\n"

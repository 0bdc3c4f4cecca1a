"""The output multiplexer: whole lines, prefixes, '\\r', long lines, partial last lines, filters, logs."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from podguard.launch.printer import CONT_END, CONT_START, LINE_CAP, Printer
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec


def _printer(**kw):
    out = io.BytesIO()
    return Printer(out, **kw), out


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
        outcome = run_job(specs, out=out, summary=False)
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
        outcome = run_job([WorkerSpec("GPU0", (sys.executable, "-c", code), prefix="GPU0:")], out=out)
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

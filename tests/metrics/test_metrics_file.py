"""`--metrics-file` and restarts: the textfile node_exporter reads, and the series a relaunch moves.

Why: node_exporter's textfile collector reads the file whenever it is scraped; a half-written file is a scrape
error or, worse, series that vanish for one scrape. A reader loop here reads the file as fast as it can while
podguard rewrites it every 50 ms (PODGUARD_METRICS_INTERVAL) and must only ever see whole files. Across `--restarts`
the attempt and restart series move and the counters never go down, though each attempt's heartbeat board starts
again from zero.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import time

from metrics_support import by, free_port, job, parse, start, try_scrape, values, wait_for

from podguard import console

FAST_FILE = {"PODGUARD_METRICS_INTERVAL": "0.05"}


def test_the_file_is_never_seen_half_written_and_keeps_its_last_values(cli_node, tmp_path):
    script, stop = job(tmp_path)
    path = tmp_path / "textfile" / "podguard.prom"
    path.parent.mkdir()
    seen: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(path.read_text())
            time.sleep(0.001)  # (a reader, not a spinner: the GIL and the 2 cores are shared with podguard)

    thread = threading.Thread(target=reader, daemon=True)
    args = ["train", "--mode", "per-gpu", "--gpu-list", "0,1", "--metrics-file", str(path)]
    proc = start(cli_node, [*args, "--", sys.executable, script, str(stop)], **FAST_FILE)
    thread.start()
    try:
        wait_for(lambda: path.exists() and "podguard_rank_heartbeats_total" in path.read_text(), "beats", proc=proc)
        time.sleep(1.0)  # ~20 rewrites under the reader
    finally:
        stop.touch()
    _, err = proc.communicate(timeout=60)
    done.set()
    thread.join()
    assert proc.returncode == 0, err

    assert len(seen) > 20
    for text in seen:  # every read is a whole exposition: it parses and ends with the last series
        families = parse(text)
        assert text.endswith("\n") and "podguard_job_restarts" in families, text[-300:]
    assert "podguard_up 1.0" in seen[0]  # 1 while the run goes on ...
    last = parse(path.read_text())  # ... the file stays after the run, with the attempt's last heartbeats
    assert values(last["podguard_up"]) == {(): 0.0}, "the file's last write must say the run is over"
    assert values(last["podguard_job_attempt"]) == {(): 1.0}
    assert set(by(last["podguard_rank_heartbeats"], "rank")) == {"0", "1"}
    assert [p.name for p in path.parent.iterdir()] == ["podguard.prom"]  # no temporary file left behind


def test_restarts_move_the_attempt_and_restart_series_and_counters_never_go_down(cli_node, tmp_path):
    script, stop = job(tmp_path)
    port, path = free_port(), tmp_path / "podguard.prom"
    args = ["train", "--mode", "per-gpu", "--gpu-list", "0", "--restarts", "2", "--metrics-port", str(port)]
    proc = start(cli_node, [*args, "--metrics-file", str(path), "--", sys.executable, script, str(stop), "crash", "5"])
    scrapes = []
    while proc.poll() is None:  # a scrape every 50 ms through all three attempts
        if (families := try_scrape(port)) is not None:
            scrapes.append(families)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.count("RESTART") == 2

    attempts = [values(f["podguard_job_attempt"])[()] for f in scrapes]
    assert {1.0, 2.0, 3.0} <= set(attempts) and attempts == sorted(attempts)
    for name in ("podguard_job_restarts", "podguard_rank_heartbeats"):
        series = [sum(values(f[name]).values()) for f in scrapes if name in f]
        assert series == sorted(series), f"{name} went down: {series}"
    final = parse(path.read_text())
    assert values(final["podguard_job_attempt"]) == {(): 3.0}
    assert values(final["podguard_job_restarts"]) == {(): 2.0}
    assert by(final["podguard_rank_heartbeats"], "rank") == {"0": 15.0}  # 5 per attempt, each board from zero


def test_a_file_that_cannot_be_written_mid_run_is_one_warning_never_a_failure(cli_node, tmp_path):
    """Mid-run the textfile's folder goes away (an unmounted volume), then comes back with a folder where the file
    was (each rename fails: a full disk fails the same way, at the write): the job goes on, one warning says it, no
    temporary file is left, and writing resumes when it can."""
    script, stop = job(tmp_path)
    folder = tmp_path / "textfile"
    folder.mkdir()
    path = folder / "podguard.prom"
    args = ["run", "--metrics-file", str(path), "--", sys.executable, script, str(stop)]
    proc = start(cli_node, args, **FAST_FILE)
    try:
        wait_for(lambda: path.exists() and "podguard_rank_heartbeats_total" in path.read_text(), "beats", proc=proc)
        folder.rename(tmp_path / "elsewhere")
        time.sleep(0.3)  # ~6 failed writes (FileNotFoundError)
        folder.mkdir()
        path.mkdir()  # a folder where the file was: each write's rename fails (IsADirectoryError)
        time.sleep(0.3)
        assert proc.poll() is None, "the job must go on"
        wait_for(  # (between two writes: a failed write removes its temporary file)
            lambda: [p.name for p in folder.iterdir()] == ["podguard.prom"], "no temporary file", timeout=5, proc=proc
        )
        path.rmdir()
        wait_for(lambda: path.is_file(), "writing to resume", proc=proc)
    finally:
        stop.touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    # (said by the writer's thread during the run: on the supervisor's terminal, in order with the job's lines)
    warnings = [line for line in out.splitlines() if "cannot be written" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"podguard: warning: --metrics-file='{path}'"), out
    assert "cannot be written" not in err, err
    assert f"podguard: --metrics-file='{path}' is written again" in out.splitlines()
    assert [p.name for p in folder.iterdir()] == ["podguard.prom"]  # no temporary file left behind
    assert values(parse(path.read_text())["podguard_up"]) == {(): 0.0}


def test_a_name_the_textfile_collector_skips_is_said(cli_node, tmp_path):
    path = tmp_path / "podguard.txt"
    proc = start(cli_node, ["run", "--metrics-file", str(path), "--", sys.executable, "-c", "pass"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"podguard: warning: --metrics-file='{path}' does not end in .prom" in err
    assert "podguard_up 0.0" in path.read_text()


def test_a_write_that_never_returns_does_not_hold_the_end_of_the_run(tmp_path):
    """A stalled volume (here a FIFO without a reader where the temporary file goes: the write's open() blocks):
    the end of the run says so and goes on instead of waiting on the write forever."""
    from podguard.metrics.exposition import snapshot_registry
    from podguard.metrics.state import MetricsState
    from podguard.metrics.textfile import FileWriter

    path = tmp_path / "podguard.prom"
    with console.captured() as said:
        registry = snapshot_registry(MetricsState(version="0", mode="auto", pod_id=""))
        writer = FileWriter(path, registry, every_s=0.2, close_wait_s=0.5)
        fifo = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        wait_for(lambda: _mkfifo(fifo), "the FIFO in place between two writes", timeout=5)
        time.sleep(0.4)  # the thread's next write is blocked in open()
        closing = threading.Thread(target=writer.close, daemon=True)
        t0 = time.monotonic()
        closing.start()
        closing.join(timeout=5)
        try:
            assert not closing.is_alive() and time.monotonic() - t0 < 2.0, "close() must not wait on a stuck write"
            assert len(said) == 1 and "a write has not returned for 0.5 s" in said[0], said
        finally:
            with open(fifo, "rb") as reader:  # let the stuck write finish
                reader.read()


def _mkfifo(path) -> bool:
    try:
        os.mkfifo(path)
    except FileExistsError:  # (a write's temporary file of the moment)
        return False
    return True


def test_a_fifo_put_at_the_path_mid_run_is_left_alone_and_said_once(tmp_path):
    """Something other than a regular file appears at PATH during the run (here a FIFO): each write leaves it alone
    (a rename would replace it), says so once, removes its temporary file; when it goes, writing resumes."""
    from podguard.metrics.exposition import snapshot_registry
    from podguard.metrics.state import MetricsState
    from podguard.metrics.textfile import FileWriter

    path = tmp_path / "podguard.prom"
    with console.captured() as said:
        registry = snapshot_registry(MetricsState(version="0", mode="auto", pod_id=""))
        writer = FileWriter(path, registry, every_s=0.05)
        try:
            path.unlink()
            os.mkfifo(path)
            wait_for(lambda: writer.error is not None, "a write to meet the FIFO", timeout=10)
            time.sleep(0.3)  # several more writes
            assert stat.S_ISFIFO(os.lstat(path).st_mode), "the FIFO must be left alone"
            assert len(said) == 1 and "it is now a FIFO (named pipe), not a regular file" in said[0], said
            assert [p.name for p in tmp_path.iterdir()] == ["podguard.prom"]
            path.unlink()
            wait_for(lambda: path.is_file(), "writing to resume", timeout=10)
            assert said[-1] == f"podguard: --metrics-file='{path}' is written again"
        finally:
            writer.close()

"""podguard.console: one write per line, the prefix, quiet, routing to a supervisor's terminal, capture."""

from __future__ import annotations

import io
import logging
import threading

import pytest

from podguard import console


def test_say_prefixes_each_line_and_warn_says_warning() -> None:
    out = io.StringIO()
    console.say("one\ntwo", stream=out)
    console.warn("disk full", stream=out)
    assert out.getvalue() == "podguard: one\npodguard: two\npodguard: warning: disk full\n"


def test_quiet_keeps_ordinary_lines_back_but_not_warnings_or_loud_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PODGUARD_QUIET", "1")
    console.say("ordinary")
    console.say("HUNG: rank 1", loud=True)
    console.warn("careful")
    assert capsys.readouterr().err == "podguard: HUNG: rank 1\npodguard: warning: careful\n"


def test_routed_lines_go_to_the_terminal_and_come_back_after() -> None:
    got: list[tuple[str, bool]] = []
    with console.captured() as lines:
        pass
    with console.routed(lambda text, loud: got.append((text, loud))):
        console.say("END kind=success", loud=True)
    assert got == [("podguard: END kind=success\n", True)]
    with console.captured() as lines:
        console.say("after")
    assert lines == ["podguard: after"]


def test_lines_from_many_threads_are_never_cut() -> None:
    class Chunky(io.StringIO):
        def write(self, s: str) -> int:  # a stream that would interleave if a line took two writes
            for ch in s:
                super().write(ch)
            return len(s)

    out = Chunky()

    def talk(n: int) -> None:
        for i in range(200):
            console.say(f"thread {n} line {i}", stream=out)

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 800
    assert all(line.startswith("podguard: thread ") and " line " in line for line in lines)


def test_a_closed_stderr_loses_the_line_not_the_run() -> None:
    closed = io.StringIO()
    closed.close()
    console.say("nobody reads this", stream=closed)  # no exception


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_status_line_is_printed_once_per_change_in_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    for key, text in [("A", "pod a: CREATED, 1s"), ("A", "pod a: CREATED, 2s"), ("B", "pod a: RUNNING, 3s")]:
        console.status(key, text)
    console.say("ready")
    assert capsys.readouterr().err == "podguard: pod a: CREATED, 1s\npodguard: pod a: RUNNING, 3s\npodguard: ready\n"


def test_on_a_terminal_a_status_is_rewritten_in_place_and_the_next_line_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    console.status("A", "pod a: CREATED", live="pod a: CREATED [1s]")
    console.status("A", "pod a: CREATED", live="pod a: CREATED [2s]")
    console.warn("slow")
    console.status("B", "pod a: RUNNING")
    console.settle()
    console.settle()  # nothing left open: no second newline
    assert term.getvalue() == (
        "\r\x1b[Kpodguard: pod a: CREATED [1s]\r\x1b[Kpodguard: pod a: CREATED [2s]\n"
        "podguard: warning: slow\n\r\x1b[Kpodguard: pod a: RUNNING\n"
    )


def test_tagged_lines_name_their_speaker_and_the_tag_ends_with_the_block() -> None:
    with console.captured() as lines:
        with console.tagged("keep llm"):
            console.say("creating\nwaiting")
            console.warn("slow")
        console.say("after")
    assert lines == [
        "podguard: keep llm: creating",
        "podguard: keep llm: waiting",
        "podguard: warning: keep llm: slow",
        "podguard: after",
    ]


def test_a_masked_secret_and_token_shaped_text_never_reach_a_line() -> None:
    key = "plain-key-without-a-known-shape-0123"
    console.mask(key)
    console.mask("short")  # too short to mask: it would hide ordinary words
    with console.captured() as lines:
        console.say(f"the server said: bad key {key}; short")
        console.line(f"END detail={key}")
        console.say("--hf_token hf_abcdefghijklmnopqrstuvwxyz0123")
    assert lines == ["podguard: the server said: bad key ***; short", "END detail=***", "podguard: --hf_token ***"]


def test_debug_logging_speaks_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("podguard.watch")
    root = logging.getLogger("podguard")
    handlers, level = list(root.handlers), root.level
    try:
        monkeypatch.delenv("PODGUARD_DEBUG", raising=False)
        console.debug_logging()
        with console.captured() as lines:
            logger.debug("poll failed: %s", "timeout")
        assert lines == []
        monkeypatch.setenv("PODGUARD_DEBUG", "1")
        console.debug_logging()
        console.debug_logging()  # once, however often asked
        with console.captured() as lines:
            logger.debug("poll failed: %s", "timeout")
        assert lines == ["podguard: debug: watch: poll failed: timeout"]
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_prose_that_looks_like_name_value_is_said_as_written() -> None:
    # Only token shapes and masked values are hidden: "an API key: exiting 124" is podguard's own prose.
    with console.captured() as lines:
        console.say("max runtime reached; not inside a RunPod pod with an API key: exiting 124", loud=True)
        console.say("cache key: 3f2a; token budget: 12")
    assert lines == [
        "podguard: max runtime reached; not inside a RunPod pod with an API key: exiting 124",
        "podguard: cache key: 3f2a; token budget: 12",
    ]

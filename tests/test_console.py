"""podguard.console: one write per line, the prefix, quiet, routing to a supervisor's terminal, capture."""

from __future__ import annotations

import io
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

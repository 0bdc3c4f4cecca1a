"""The keeper's lines through the console (keeper/events.py): its events tagged with its name, the record without
the tag, the watch line once per change in a log, the key scrubbed from what is kept."""

from __future__ import annotations

import json

from podguard import console
from podguard.pods.keeper.events import Events
from podguard.pods.keeper.record import KeepStore


def test_an_event_is_one_tagged_line_and_one_record_without_the_tag(tmp_path):
    store = KeepStore(tmp_path, "llm-train")
    events = Events("llm-train", store, scrub=lambda text: text.replace("s3cr3t-key-value", "***"))
    with console.captured() as lines, console.tagged("keep llm-train"):
        events.say("recovery", "EXITED without an outcome: starting it (s3cr3t-key-value)", pod="abc123")
        events.close()
    assert lines == ["podguard: keep llm-train: EXITED without an outcome: starting it (***)"]
    (record,) = [json.loads(line) for line in store.events_path.read_text().splitlines()]
    assert record["event"] == "recovery" and record["pod"] == "abc123"
    assert (
        record["text"] == "EXITED without an outcome: starting it (***)"
    )  # the tag is the terminal's, not the record's


def test_the_watch_line_is_said_once_per_change_in_a_log(tmp_path):
    events = Events("llm-train", KeepStore(tmp_path, "llm-train"))
    with console.captured() as lines, console.tagged("keep llm-train"):
        events.watching("pod llm-train (abc): RUNNING, job running", "last line 1s ago")
        events.watching("pod llm-train (abc): RUNNING, job running", "last line 2s ago")  # the clock alone: no line
        events.watching("pod llm-train (abc): RUNNING, job quiet", "last line 9s ago")
        events.close()
    assert lines == [
        "podguard: keep llm-train: pod llm-train (abc): RUNNING, job running",
        "podguard: keep llm-train: pod llm-train (abc): RUNNING, job quiet",
    ]

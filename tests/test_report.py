"""The preflight report file: atomic writes, latest.json, a bounded folder."""

from __future__ import annotations


def test_reports_are_pruned_to_the_newest(tmp_path, monkeypatch):
    from podguard import report

    monkeypatch.setattr(report, "KEEP_REPORTS", 3)
    paths = []
    for i in range(5):
        monkeypatch.setattr(report.time, "strftime", lambda fmt, t=None, i=i: f"2026010{i}T000000")
        paths.append(report.write_report(tmp_path, "health", {"n": i}))
    left = sorted(p.name for p in (tmp_path / "reports").glob("2026*.json"))
    assert left == [p.name for p in paths[-3:]]
    assert (tmp_path / "reports" / "latest.json").exists()

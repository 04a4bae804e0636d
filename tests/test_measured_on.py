"""The line a chapter prints beside numbers read from a benchmark JSON, and the figure title that shares its pieces.
CPU only, made-up provenance."""

from __future__ import annotations

from mta.bench.plots import measured_on, provenance_line

PROV = {"gpu": "Fake GPU", "torch": "9.9", "triton": "8.8", "git_commit": "0123456789abcdef" * 2 + "01234567",
        "git_dirty": False, "utc_time": "2000-01-01T00:00:00+00:00"}


def test_measured_on_names_the_gpu_versions_commit_and_date():
    assert measured_on({"provenance": PROV}) == \
        "measured on Fake GPU · torch 9.9 · triton 8.8 · mta commit 01234567 · 2000-01-01"
    assert provenance_line(PROV) == "Fake GPU · torch 9.9 · triton 8.8 · 01234567"


def test_measured_on_marks_uncommitted_changes():
    line = measured_on({"provenance": {**PROV, "git_dirty": True}})
    assert "mta commit 01234567+dirty ·" in line
    assert measured_on({"provenance": {**PROV, "git_dirty": None}}) == measured_on({"provenance": PROV})


def test_measured_on_says_what_the_provenance_lacks():
    assert measured_on({"provenance": {**PROV, "git_commit": None}}) == \
        "measured on Fake GPU · torch 9.9 · triton 8.8 · commit unknown · 2000-01-01"
    assert measured_on({"provenance": {"gpu": "Fake GPU"}}) == \
        "measured on Fake GPU · torch ? · triton ? · commit unknown"
    assert provenance_line({"gpu": "Fake GPU"}) == "Fake GPU · torch ? · triton ? · commit ?"

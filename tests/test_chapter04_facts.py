"""Facts chapter 04 reads from the committed benchmark (``figures/bench_conv_h200_full.json``): what its cells
state about the run's checks, asserted here in full so the notebook's cells stay short."""

from __future__ import annotations

import pytest

from mta.bench import conv as conv_bench
from mta.bench import plots as bench_plots
from mta.course.figures import FIGURES_DIR

BENCH = FIGURES_DIR / "bench_conv_h200_full.json"


@pytest.fixture(scope="module")
def bench():
    return bench_plots.load_results(BENCH)


def test_the_run_is_complete_and_checked_at_every_shape(bench):
    conv = [r for r in bench["results"] if r["impl"] == "mta_conv"]
    assert bench["complete"] and conv
    assert all(r["check"]["ok"] for r in conv)
    assert {(r["head_dim"], r["cq"], r["ck"], r["seq_len"]) for r in conv} == {
        (s["head_dim"], s["cq"], s["ck"], s["seq_len"]) for s in conv_bench.shape_ratios(bench["results"])}


def test_check_records_say_what_the_chapter_says(bench):
    # The output is checked against the reference's fp32 computation on the same bf16 inputs on all heads where
    # the reference fits, else on the leading heads with the inputs cast to fp32; the gradients in float64, on at
    # most the heads the output was checked on; the same heads for both kernel sizes at each (d, N).
    checked = {}
    for r in bench["results"]:
        if r["impl"] != "mta_conv":
            continue
        c = r["check"]
        full = c["heads_checked"] == r["heads"]
        assert r["dtype"] == "bfloat16"
        assert c["reference"] == (
            "conv_attention_reference, all heads (bfloat16 inputs, fp32 compute)" if full else
            f"conv_attention_reference on float32 inputs, query heads 0..{c['heads_checked'] - 1} of {r['heads']}")
        assert "in float64" in c["grad_reference"] and c["grad_heads_checked"] <= c["heads_checked"]
        row = (r["heads"], c["heads_checked"], c["grad_heads_checked"])
        assert checked.setdefault((r["head_dim"], r["seq_len"]), row) == row


def test_headline_shape_is_checked(bench):
    headline = conv_bench.headline_ratios(bench)
    assert {h["head_dim"] for h in headline} == {64, 128}
    assert all(h["check_ok"] for h in headline)

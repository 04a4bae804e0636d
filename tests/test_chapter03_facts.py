"""What chapter 03 (section 6) says about the committed flash benchmark, `figures/bench_flash.json`, asserted here so
that the notebook prints the numbers and a new measurement that changes a statement fails a test."""

from __future__ import annotations

import math
import statistics

import pytest

from mta.bench import plots
from mta.course.figures import FIGURES_DIR

PASSES = ("fwd", "bwd")


@pytest.fixture(scope="module")
def bench():
    return plots.load_results(FIGURES_DIR / "bench_flash.json")


@pytest.fixture(scope="module")
def timed(bench):
    return [r for r in bench["results"] if r.get("fwd_tflops") and r.get("bwd_tflops")]


def _at(timed, r, impl, **changes):
    """The record of ``impl`` at ``r``'s point (dtype, d, causal, N), with ``changes`` to that point."""
    point = {key: r[key] for key in ("dtype", "head_dim", "causal", "seq_len")}
    return plots.select(timed, impl=impl, **{**point, **changes})[0]


def test_the_file_counts_flops_as_the_chapter_says(bench):
    records = bench["results"]
    assert all(math.isclose(r["fwd_flops"], 4 * r["batch"] * r["heads"] * r["seq_len"] ** 2 * r["head_dim"]
                            * (0.5 if r["causal"] else 1.0)) for r in records)
    assert all(math.isclose(r["bwd_flops"], 2.5 * r["fwd_flops"]) for r in records)
    assert len({(r["batch"] * r["seq_len"], r["heads"] * r["head_dim"]) for r in records}) == 1


def test_mta_s_outputs_passed_the_benchmark_s_check(bench):
    assert all(r["check"]["ok"] for r in bench["results"] if r["impl"] == "mta" and r.get("check"))


def test_mta_is_faster_than_sdpa_flash_except_the_shortest_forward_at_the_larger_head_dim(bench, timed):
    assert all(s[f"{p}_vs_sdpa_flash"] > 1 for s in bench["summary"] for p in PASSES)
    n_min = min(r["seq_len"] for r in timed)
    d_max = max(r["head_dim"] for r in timed)
    not_faster = [(p, r) for r in plots.select(timed, impl="mta") for p in PASSES
                  if r[f"{p}_tflops"] <= _at(timed, r, "sdpa_flash")[f"{p}_tflops"]]
    assert not_faster and all(p == "fwd" and r["seq_len"] == n_min and r["head_dim"] == d_max for p, r in not_faster)


def test_cudnn_is_faster_than_mta_most_at_the_larger_head_dim(bench):
    summary = bench["summary"]
    assert all(s[f"{p}_vs_sdpa_cudnn"] < 1 for s in summary for p in PASSES)
    head_dims = sorted({s["head_dim"] for s in summary})
    for p in PASSES:
        by_d = {d: statistics.median(s[f"{p}_vs_sdpa_cudnn"] for s in summary if s["head_dim"] == d)
                for d in head_dims}
        assert min(by_d, key=by_d.get) == max(head_dims)


def test_mta_s_backward_runs_at_a_lower_rate_than_its_forward(timed):
    assert all(r["bwd_tflops"] < r["fwd_tflops"] for r in plots.select(timed, impl="mta"))


def test_causal_runs_at_a_lower_rate_at_the_shortest_length(timed):
    lengths = sorted({r["seq_len"] for r in timed})
    ratio = {(r["impl"], r["dtype"], r["head_dim"], r["seq_len"]):
             r["fwd_tflops"] / _at(timed, r, r["impl"], causal=False)["fwd_tflops"] for r in timed if r["causal"]}
    short = [v for k, v in ratio.items() if k[3] == lengths[0]]
    long_ = [v for k, v in ratio.items() if k[3] == lengths[-1]]
    assert max(short) < 1 and min(long_) > max(short)

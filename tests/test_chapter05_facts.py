"""Facts chapter 05 states about the backward that ships and the committed H200 runs it reads, asserted here so that
the notebook's cells stay short: the plan's rule, which backward each run measured, and that the two quick runs it
sets side by side differ only in the backward."""

from __future__ import annotations

import torch

from mta import conv_plan
from mta.bench import plots as bench_plots
from mta.course.figures import FIGURES_DIR


def _load(name):
    return bench_plots.load_results(FIGURES_DIR / name)


def test_two_phases_for_bf16_on_hopper_from_three_query_shifts():
    assert conv_plan.MIN_QUERY_SHIFTS == 3
    for d in (64, 128):
        for cq in range(1, 12):
            backward = conv_plan.plan_conv(torch.bfloat16, d, (cq, 11), True, "hopper").backward
            assert backward == ("two_phase" if cq >= 3 else "one_pass"), (d, cq, backward)
        for dtype in (torch.float16, torch.float32):
            assert conv_plan.plan_conv(dtype, d, (6, 11), True, "hopper").backward == "one_pass"
        assert conv_plan.plan_conv(torch.bfloat16, d, (6, 11), True, "other").backward == "one_pass"
        assert conv_plan.plan_conv(torch.float32, d, (6, 11), True, "interpreter").backward == "one_pass"


def test_the_full_run_measured_the_two_phase_backward():
    # Section 6d: the full H200 run, bf16, Hopper: the default plan is two phases at every benchmarked kernel.
    bench = _load("bench_conv_h200_full.json")
    assert bench["complete"] and bench["config"]["dtype"] == "bfloat16"
    assert "H200" in bench["provenance"]["gpu"] and bench["provenance"]["compute_capability"] == "9.0"
    for cq, ck in bench["config"]["kernels"]:
        for c in bench["config"]["configurations"]:
            plan = conv_plan.plan_conv(torch.bfloat16, c["head_dim"], (cq, ck), True, "hopper")
            assert plan.backward == "two_phase"


def test_the_two_quick_runs_differ_only_in_the_backward():
    # Section 6c: the one-pass run and the default run share the benchmark's configuration and GPU.
    one_pass, default = _load("bench_conv_h200_one_pass.json"), _load("bench_conv_h200.json")
    assert one_pass["config"] == default["config"]
    assert one_pass["provenance"]["gpu"] == default["provenance"]["gpu"]
    shapes = {(s["head_dim"], s["cq"], s["ck"], s["seq_len"]) for s in default["shapes"]}
    assert shapes == {(s["head_dim"], s["cq"], s["ck"], s["seq_len"]) for s in one_pass["shapes"]}
    assert (64, 6, 11, 8192) in shapes and (128, 6, 11, 8192) in shapes

"""What chapter 06 and appendix 06b say of the committed benchmark files under ``figures/``: each statement the text
makes of a measurement holds for the file it reads. (The notebooks print the numbers; the checks live here, so that
a cell shows the facts rather than a block of asserts.)"""

from __future__ import annotations

import pytest

from mta.bench import plots as bench_plots
from mta.course import plots_06
from mta.course.figures import FIGURES_DIR

SMS_H100 = 132


def _load(name):
    path = FIGURES_DIR / name
    if not path.exists():
        pytest.skip(f"figures/{name} is not committed")
    return bench_plots.load_results(path)


@pytest.fixture(scope="module")
def prefill():
    """The prefill grid of chapter 06, section 7, at the longest cache of ``bench_decode.json``."""
    flash = (FIGURES_DIR / "bench_flash.json")
    return plots_06.prefill_grid_rows(_load("bench_decode.json"), bench_plots.load_results(flash)
                                      if flash.exists() else None, SMS_H100)


def test_both_decoders_passed_their_checks():
    checked = [r for r in _load("bench_decode.json")["results"] if "check" in r]
    assert checked and all(r["check"]["ok"] for r in checked)


def test_prefill_grid_time_follows_its_waves(prefill):
    """Section 7: from B = 1 to 8 the prefill grid's time grows as its waves do, whatever the batch's bytes."""
    pairs = [(prefill[(1, *key)], prefill[(8, *key)]) for key in {k[1:] for k in prefill}
             if (1, *key) in prefill and (8, *key) in prefill]
    assert pairs
    for one, eight in pairs:
        assert abs(eight["us"] / one["us"] / (eight["waves"] / one["waves"]) - 1) < 0.1


def test_prefill_grid_runs_its_padded_products_near_the_prefill_pace(prefill):
    """Section 7: its busy SMs run the products of all BLOCK_M rows close to the pace of chapter 03's prefill."""
    rows = [p for p in prefill.values() if p["at_prefill"] is not None]
    assert rows
    assert all(p["per_sm"] >= 0.75 * p["at_prefill"] for p in rows)


def test_prefill_gap_is_widest_with_the_fewest_programs(prefill):
    gap = {key: p["us"] / p["decoder_us"] for key, p in prefill.items()}
    widest = max(gap, key=gap.get)
    assert prefill[widest]["programs"] == min(p["programs"] for p in prefill.values())
    at_8 = sorted((key for key in gap if key[0] == 8), key=lambda key: prefill[key]["programs"])
    assert len(at_8) > 1 and gap[at_8[-1]] > gap[at_8[0]]      # wider with Hq = 32 than with Hq = 8


def test_decode_step_is_level_with_sdpa_in_gpu_time_and_within_twice_its_wall_time():
    """Appendix 06b, section 6: on GPU time mta.decode_attention is level with SDPA or faster at every shape; on wall
    time per step both decoders are within twice SDPA's at every shape (the target for a call of one or two short
    kernels)."""
    quick = _load("bench_decode_h200_quick.json")
    keys = ("batch", "heads", "kv_heads", "head_dim", "seq_len")

    def against_sdpa(impl):
        return [(r, bench_plots.select(quick["results"], impl="sdpa", **{k: r[k] for k in keys})[0])
                for r in bench_plots.select(quick["results"], impl=impl)]

    decode, conv_decode = against_sdpa("mta_decode"), against_sdpa("mta_conv_decode")
    assert decode and len(conv_decode) == len(decode)
    assert all(r["ms"] / s["ms"] < 1.05 for r, s in decode)
    assert all(r["wall_ms"] / s["wall_ms"] < 2 for r, s in decode + conv_decode)


def test_a_captured_step_turns_the_comparison_around():
    """Appendix 06b, section 6: eager, the plain model steps slower with mta's kernels than with SDPA; captured in a
    CUDA graph, faster, at every batch."""
    model = _load("bench_model.json")
    per_step = {(r["variant"], r["mode"], r["batch"]): r["ms_per_step"]
                for r in model["results"] if r["task"] == "generation"}
    for B in model["config"]["generation"]["batches"]:
        assert per_step["plain_ours", "eager", B] > per_step["plain_sdpa", "eager", B]
        assert per_step["plain_ours", "graphed", B] < per_step["plain_sdpa", "graphed", B]

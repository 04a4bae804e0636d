"""The model benchmark at tiny shapes: the decoder's layout, SDPA's layer against mta's (same weights, fp32), a
training step of each variant, greedy generation against the forward's argmax, the targets, a whole run with fake
measurements (JSON, PNG, tables, the report's section) and the command line. On the CPU the kernels run in Triton's
interpreter."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import DEVICE
from mta import MultiTokenAttention
from mta.bench import harness, plots, report
from mta.bench import model as mb
from mta.bench.decoder import VARIANTS, Decoder, DecoderConfig, SDPAAttention, build

TINY = DecoderConfig(vocab=97, dim=64, layers=2, heads=4, kv_heads=2, ffn_dim=96, mta_layers=(1,))


def tokens(*shape, seed=0):
    return torch.randint(0, TINY.vocab, shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


# --- the model ------------------------------------------------------------------------------------------------

def test_the_full_model_has_mta_in_every_fourth_layer_and_a_tied_head():
    config = DecoderConfig()
    assert config.mta_layer_indices() == (2, 6, 10)
    with torch.device("meta"):
        models = {v: Decoder(config, v) for v in VARIANTS}
    kernels = [b.attn.kernel_size for b in models["mta"].blocks]
    assert kernels == [(6, 11) if i in (2, 6, 10) else (1, 1) for i in range(12)]
    assert all(isinstance(b.attn, MultiTokenAttention) and b.attn.kernel_size == (1, 1)
               for b in models["plain_ours"].blocks)
    assert all(isinstance(b.attn, SDPAAttention) for b in models["plain_sdpa"].blocks)
    plain = sum(p.numel() for p in models["plain_ours"].parameters())
    assert plain == config.parameters() == sum(p.numel() for p in models["plain_sdpa"].parameters())
    assert 150e6 < plain < 180e6  # the tied head counted once
    assert sum(p.numel() for p in models["mta"].parameters()) == plain + 3 * 16 * 6 * 11
    with pytest.raises(ValueError, match="mta_layers"):
        DecoderConfig(layers=2, mta_layers=(2,)).mta_layer_indices()
    with pytest.raises(ValueError, match="variant"):
        Decoder(TINY, "flash")


def test_every_variant_gets_the_same_weights_and_the_bf16_build_keeps_mta_kernels_fp32():
    states = {v: build(TINY, v).state_dict() for v in VARIANTS}
    for name, value in states["plain_ours"].items():
        assert torch.equal(value, states["plain_sdpa"][name]) and torch.equal(value, states["mta"][name]), name
    model = build(TINY, "mta", dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16 and model.blocks[1].attn.conv_weight.dtype == torch.float32


def test_sdpa_layer_equals_mta_plain_layer_in_fp32():
    """The exactness check of the SDPA variant: the same weights through SDPA and through mta's flash kernel (and
    MTA at its identity kernel) give the same logits up to rounding."""
    x = tokens(2, 16)
    with torch.no_grad():
        logits = {v: build(TINY, v, device=DEVICE)(x) for v in VARIANTS}
    scale = logits["plain_ours"].abs().max()
    assert (logits["plain_sdpa"] - logits["plain_ours"]).abs().max() <= 1e-5 * scale
    assert (logits["mta"] - logits["plain_ours"]).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_training_step_updates_every_parameter(variant):
    model = build(TINY, variant, device=DEVICE)
    if variant == "mta":  # away from the identity, so that the convolution is in play
        with torch.no_grad():
            model.blocks[1].attn.conv_weight.add_(0.1 * torch.randn(4, 6, 11, generator=torch.Generator()).to(DEVICE))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = mb.training_step(model, optimizer, tokens(2, 16), tokens(2, 16, seed=1), amp_dtype=None)()
    assert torch.isfinite(loss) and loss.item() == pytest.approx(torch.log(torch.tensor(97.0)).item(), rel=0.1)
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters()), "a parameter did not move"
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_matches_the_forward_argmax(variant):
    model = build(TINY, variant, device=DEVICE)
    prompt, new = tokens(2, 6), 3
    out = mb.generate(model, prompt, new)
    generated = out["tokens"]
    assert generated.shape == (2, new + 1) and out["capture_ms"] is None
    assert out["prefill_ms"] > 0 and out["decode_ms"] > 0
    with torch.no_grad():
        argmax = model(torch.cat([prompt, generated[:, :-1]], dim=1)).argmax(-1)[:, prompt.shape[1] - 1:]
    assert torch.equal(argmax, generated)


def test_generation_goes_through_the_captured_step():
    """What ``capture_fn`` returns runs every decode step (a CUDA graph on a GPU; here a counting wrapper)."""
    model, calls = build(TINY, "plain_sdpa", device=DEVICE), []

    def capture_fn(m, step_fn, example, caches):
        assert m is model and example.shape == (2, 1) and len(caches) == TINY.layers
        assert all(int(c.lengths[0]) == 6 for c in caches)  # after the prefill
        return lambda x: calls.append(x) or step_fn(x)
    out = mb.generate(model, tokens(2, 6), 4, capture_fn)
    assert len(calls) == 4 and out["capture_ms"] >= 0
    assert torch.equal(out["tokens"], mb.generate(model, tokens(2, 6), 4)["tokens"])


# --- targets, the run, the report -----------------------------------------------------------------------------

def record(task, variant, mode, batch, seq_len, rate, **extra):
    return {"task": task, "variant": variant, "mode": mode, "batch": batch, "seq_len": seq_len,
            "new_tokens": 256 if task == "generation" else 0, "layers": 12, "tokens_per_s": rate,
            "ms_per_step": None if rate is None else 1e3 / rate, "status": "ok" if rate else "error", **extra}


def fake_results() -> list[dict]:
    train = {("mta", "eager"): 60.0, ("plain_ours", "eager"): 100.0, ("plain_sdpa", "eager"): 105.0,
             ("mta", "reduce_overhead"): 80.0, ("plain_ours", "reduce_overhead"): 100.0,
             ("plain_sdpa", "reduce_overhead"): 100.0}
    results = [record("training", v, m, b, n, rate * (1 if n == 2048 else 0.5))
               for (v, m), rate in train.items() for b, n in mb.TRAIN_SHAPES]
    gen = {("mta", "eager"): 10.0, ("mta", "graphed"): 90.0, ("plain_ours", "eager"): 20.0,
           ("plain_ours", "graphed"): 100.0, ("plain_sdpa", "eager"): 20.0, ("plain_sdpa", "graphed"): None}
    results += [record("generation", v, m, b, 2048, rate and rate * b, prefill_ms=12.5)
                for (v, m), rate in gen.items() for b in mb.GEN_BATCHES]
    return results


def test_targets_are_ratios_of_tokens_per_second_with_pass_or_miss():
    found = {(t["target"], t["at"]): t for t in mb.targets(fake_results())}
    assert len(found) == 9
    t = found["plain_ours_vs_sdpa_training", "N=2048"]
    assert t["measured"] == pytest.approx(100 / 105) and t["threshold"] == 0.9 and t["ok"] is True
    assert found["mta_vs_plain_training_eager", "N=2048"]["ok"] is False  # 0.60 < 0.75
    assert found["mta_vs_plain_training_eager", "N=8192"]["threshold"] == 0.65
    assert found["mta_vs_plain_training_compiled", "N=8192"]["measured"] == pytest.approx(0.8)
    assert found["mta_vs_plain_generation_graphed", "B=8"]["measured"] == pytest.approx(0.9)
    assert found["mta_graphed_vs_eager_generation", "B=1"]["measured"] == pytest.approx(9.0)
    assert found["mta_graphed_vs_eager_generation", "B=1"]["ok"] is True
    missing = mb.targets([r for r in fake_results() if r["variant"] != "plain_sdpa"])
    assert [t["ok"] for t in missing if t["target"] == "plain_ours_vs_sdpa_training"] == [None, None]


class FakeModelBenchmark(mb.ModelBenchmark):
    """Its measurements come from :func:`fake_results`, with nothing run."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.measured = []

    def measure_training(self, shape, tools):
        return self._fake(shape)

    def measure_generation(self, shape, tools):
        return self._fake(shape)

    def _fake(self, shape):
        self.measured.append(shape)
        if shape.variant == "plain_sdpa" and shape.mode == "graphed":
            raise RuntimeError("capture failed")
        found = [r for r in fake_results() if (r["task"], r["variant"], r["mode"], r["batch"], r["seq_len"]) ==
                 (shape.task, shape.variant, shape.mode, shape.batch, shape.seq_len)]
        return {k: v for k, v in found[0].items() if k in ("tokens_per_s", "ms_per_step", "prefill_ms")}


TOOLS = harness.Tools(timer=None, device="cpu", warn=print)


def test_the_shapes_go_variant_by_variant_and_parts_split_them():
    bench = mb.ModelBenchmark()
    full = bench.shapes(quick=False)
    assert len(full) == 3 * (2 * 2 + 2 * 2) and {s.layers for s in full} == {12}
    assert [s.variant for s in full] == sorted((s.variant for s in full), key=VARIANTS.index)
    assert {s.layers for s in bench.shapes(quick=True)} == {mb.QUICK_LAYERS}
    training = mb.ModelBenchmark(part="training").shapes(False)
    generation = mb.ModelBenchmark(part="generation").shapes(False)
    assert {s.task for s in training} == {"training"} and {s.task for s in generation} == {"generation"}
    assert sorted(map(repr, training + generation)) == sorted(map(repr, full))
    # The config does not name the part, so a generation run can resume a training run's JSON.
    assert mb.ModelBenchmark(part="training").config(False, 1, 2) == bench.config(False, 1, 2)


def test_a_run_writes_json_with_targets_and_a_png_and_the_report_renders_it(tmp_path, capsys):
    out = tmp_path / "bench_model.json"
    bench = FakeModelBenchmark()
    assert harness.run_benchmark(bench, TOOLS, out=out, progress=False) == 0  # a missed target is no failure
    data = json.loads(out.read_text())
    assert len(data["results"]) == 24 and data["complete"]
    failed = [r for r in data["results"] if r["status"] != "ok"]
    assert [(r["variant"], r["mode"]) for r in failed] == [("plain_sdpa", "graphed")] * 2
    assert "RuntimeError: capture failed" in failed[0]["error"]
    assert data["config"]["mta_layers"] == [2, 6, 10] and data["config"]["tied_head"] is True
    assert {t["ok"] for t in data["targets"]} == {True, False}
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "!!! generation plain_sdpa graphed B=1" in printed and "MISSED" in printed

    text = report.section("bench_model.json", data)
    assert text.startswith("## `figures/bench_model.json`: a whole model in tokens/s")
    assert "| eager | 8 | 2048 | 60 | 100 | 105 | 16.67 | 10.00 | 9.52 | 0.60 | 0.95 |" in text
    assert "| graphed | 8 | 720 | 800 | err | 1.39 | 1.25 | - | 12.5 | 12.5 | - | 0.90 |" in text
    assert ("| the MTA model over the plain model through mta's kernels, training, eager | N=2048 | 0.60 | 0.75 | "
            "MISSED |") in text
    assert report.KINDS[-1] == "model"  # its section comes after the kernels'
    assert report.render({"bench_model.json": data}) == f"{report.PREAMBLE}\n{text}"


def test_a_part_resumes_from_the_other(tmp_path):
    out = tmp_path / "bench_model.json"
    first = FakeModelBenchmark(part="training")
    harness.run_benchmark(first, TOOLS, out=out, progress=False)
    second = FakeModelBenchmark(part="generation")
    harness.run_benchmark(second, TOOLS, out=out, resume=True, progress=False)
    assert {s.task for s in second.measured} == {"generation"}
    data = json.loads(out.read_text())
    assert len(data["results"]) == 24 and all(t["measured"] is not None for t in data["targets"])


def test_plot_model_draws_training_and_generation_panels(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {"provenance": {"gpu": "Fake GPU"}, "config": {"model": {"layers": 12, "dim": 1024}},
            "results": fake_results()}
    fig = plots.plot_model(data)
    try:
        visible = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in visible] == ["training, B=8 N=2048", "training, B=2 N=8192",
                                                      "generation, B=1", "generation, B=8"]
        assert len(visible[0].patches) == 6 and len(visible[3].patches) == 5  # SDPA graphed failed: no bar
        assert "Fake GPU" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


# --- the command line -----------------------------------------------------------------------------------------

def test_the_command_line(monkeypatch, capsys, tmp_path):
    from mta.bench.__main__ import build_parser, main
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["model", "--help"])
    assert exit_info.value.code == 0 and "--part" in capsys.readouterr().out
    args = build_parser().parse_args(["model", "--quick", "--part", "generation", "--gen-runs", "2"])
    assert (args.part, args.gen_runs, args.out) == ("generation", 2, "figures/bench_model.json")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["model", "--quick", "--out", str(tmp_path / "never.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not (tmp_path / "never.json").exists()


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="part"):
        mb.ModelBenchmark(part="both")
    with pytest.raises(ValueError, match="gen_runs"):
        mb.ModelBenchmark(gen_runs=0)

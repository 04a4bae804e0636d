"""The host benchmark on the CPU: its cases, the timing loop against a fake clock, the targets' pass or miss, a whole
run with fake calls (JSON, PNG, tables, the report's section), the calls it builds (tiny, fp32, in Triton's
interpreter) and the command line."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from conftest import DEVICE
from mta.bench import harness, plots, report
from mta.bench import host as hb

TOOLS = harness.Tools(timer=None, device="cpu", warn=print)


# --- the cases ------------------------------------------------------------------------------------------------

def test_the_cases_are_the_issues_with_their_targets():
    full, quick = hb.cases(), hb.cases(quick=True)
    assert len(full) == 16 and len(quick) == 10 and set(quick) < set(full)
    labels = [s.label() for s in full]
    assert len(set(labels)) == len(labels)
    assert labels[0] == "flash_attention forward, B 1, 16/4 heads, N 2048, d 64"
    assert labels[1] == "conv_attention 6x11 forward, B 1, 16/4 heads, N 2048, d 64"
    assert "conv_attention 6x11 forward + backward, B 1, 8/8 heads, N 16384, d 64" in labels
    assert "decode_attention, B 1, 32/8 heads, d 128, 16384 keys" in labels
    assert labels[-2:] == ["MultiTokenAttention.step 6x11, B 8, dim 1024, 16/4 heads, prefix 2048",
                           "MultiTokenAttention.step 1x1, B 8, dim 1024, 16/4 heads, prefix 2048"]
    conv_bwd = [(s.heads, s.head_dim, s.seq_len) for s in full if s.op == "conv_attention" and s.backward]
    assert conv_bwd == [(8, 64, n) for n in (1024, 4096, 8192, 16384)] + [(16, 128, n) for n in (1024, 4096, 8192)]
    groups = [s.target for s in full]
    assert groups.count("single_launch") == 5 and groups.count("conv_forward_backward") == 7
    assert groups[:3] == ["single_launch", "conv_forward", "flash_forward_backward"] and set(groups) == set(hb.TARGETS)
    # A record gives its shape back (what --resume needs), and the shapes are hashable.
    bench = hb.HostBenchmark()
    assert {bench.shape_of({"impl": "mta", **vars(s)}) for s in full} == set(full)


# --- timing ---------------------------------------------------------------------------------------------------

class FakeDevice:
    """A clock that only calls advance, and a log of calls, clock reads and synchronisations."""

    def __init__(self):
        self.now, self.log = 0.0, []

    def clock(self):
        self.log.append("clock")
        return self.now

    def synchronize(self):
        self.log.append("sync")

    def call(self, seconds):
        costs = iter(seconds) if isinstance(seconds, list) else None

        def call():
            self.log.append("call")
            self.now += next(costs) if costs else seconds
        return call


def test_the_loop_times_calls_back_to_back_and_leaves_the_synchronisations_out():
    device = FakeDevice()
    # 2 warm-up calls, then three loops of 4 calls taking 1, 3 and 2 us each.
    costs = [1.0] * 2 + [1e-6] * 4 + [3e-6] * 4 + [2e-6] * 4
    samples = hb.host_time_samples_us({"a": device.call(costs)}, calls=4, repeats=3, warmup=2, clock=device.clock,
                                      synchronize=device.synchronize)
    assert samples.keys() == {"a"} and samples["a"] == pytest.approx([1.0, 3.0, 2.0])
    loop = ["sync", "clock", *["call"] * 4, "clock", "sync"]
    assert device.log == ["call"] * 2 + loop * 3  # nothing synchronises between calls nor inside the clocks
    with pytest.raises(ValueError, match="calls >= 1"):
        hb.host_time_samples_us({"a": lambda: None}, calls=0, synchronize=lambda: None)


def test_the_loops_of_the_calls_alternate_round_by_round():
    device = FakeDevice()

    def named(name, seconds):
        call = device.call(seconds)
        return lambda: (device.log.append(name), call())
    samples = hb.host_time_samples_us({"a": named("a", 2e-6), "b": named("b", 1e-6)}, calls=2, repeats=3, warmup=1,
                                      clock=device.clock, synchronize=device.synchronize)
    assert list(samples) == ["a", "b"]
    assert samples["a"] == pytest.approx([2.0] * 3) and samples["b"] == pytest.approx([1.0] * 3)
    names = [entry for entry in device.log if entry in ("a", "b")]
    assert names == ["a", "b"] + ["a", "a", "b", "b"] * 3  # the warm-up in the dict's order, then loops a, b, a, b
    loop = ["sync", "clock", *["call"] * 2, "clock", "sync"]
    assert [entry for entry in device.log if entry not in ("a", "b")] == ["call"] * 2 + loop * 6


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer: a GPU captures the call")
def test_a_capture_that_fails_is_a_result_not_an_error():
    """Without CUDA (here) the capture itself fails: the GPU work is None, with why."""
    value, why = hb.graph_time_us(lambda: None)
    assert value is None and why


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer: no GPU to profile")
def test_launches_without_a_gpu_are_none_with_why():
    value, why = hb.launches_per_call(lambda: None)
    assert value is None and why


# --- targets, the run, the report -----------------------------------------------------------------------------

#: mta's and SDPA's CPU us per call by target group: the step misses its target, the others meet it.
CPU_US = {"single_launch": (15.0, 10.0), "conv_forward": (25.0, 10.0), "flash_forward_backward": (12.0, 10.0),
          "conv_forward_backward": (25.0, 10.0), "layer_step": (50.0, 20.0)}


def fake_calls(device: FakeDevice, shape, _):
    if shape.op == "decode_attention" and shape.batch == 1 and shape.seq_len == 16384:
        raise RuntimeError("no room")
    ours, sdpa = CPU_US[shape.target]
    return {"mta": device.call(ours * 1e-6), "sdpa": device.call(sdpa * 1e-6)}


def fake_bench(calls=hb.CALLS, repeats=3):
    device = FakeDevice()
    timer = functools.partial(hb.host_time_samples_us, clock=device.clock, synchronize=device.synchronize)

    def graph(call, replays):
        assert replays == calls
        return (None, "RuntimeError: capture failed") if getattr(call, "uncapturable", False) else (7.0, None)

    def launches(call):  # mta's calls launch 4 kernels, SDPA's 1, the uncapturable step none it can count
        return (None, "RuntimeError: no profiler") if getattr(call, "uncapturable", False) else (call.launches, None)

    def maker(shape, device_):
        made = fake_calls(device, shape, device_)
        made["mta"].launches, made["sdpa"].launches = 4, 1
        if shape.op == hb.STEP and shape.cq == 6:
            made["mta"].uncapturable = True
        return made
    return hb.HostBenchmark(calls, repeats, call_maker=maker, host_timer=timer, graph_timer=graph,
                            launch_counter=launches)


def test_targets_hold_the_ratio_of_cpu_times_to_the_most_it_may_be():
    def record(impl, shape, cpu):
        return {"impl": impl, **vars(shape), "cpu_us": cpu}
    flash, step, decode = hb.cases()[0], hb.cases()[-1], hb.cases()[11]
    results = [record("mta", flash, 20.0), record("sdpa", flash, 10.0),  # 2.0: at the limit, met
               record("mta", step, 41.0), record("sdpa", step, 20.0),  # 2.05: missed
               record("mta", decode, 5.0), record("sdpa", decode, None)]  # not measured
    found = {t["case"]: t for t in hb.targets(results)}
    assert found[flash.label()] == {"target": "single_launch", "what": hb.TARGETS["single_launch"][0],
                                    "case": flash.label(), "measured": 2.0, "at_most": 2.0, "ok": True}
    assert found[step.label()]["measured"] == pytest.approx(2.05) and found[step.label()]["ok"] is False
    assert found[decode.label()]["measured"] is None and found[decode.label()]["ok"] is None
    assert [hb.TARGETS[g][1] for g in ("conv_forward", "flash_forward_backward", "conv_forward_backward")] == [
        3.0, 1.5, 3.0]


def test_a_run_writes_json_with_targets_and_a_png_and_the_report_renders_it(tmp_path, capsys):
    out = tmp_path / "bench_host.json"
    assert harness.run_benchmark(fake_bench(), TOOLS, out=out, progress=False) == 0  # a miss is no failure
    data = json.loads(out.read_text())
    assert data["complete"] and len(data["results"]) == 2 * 16
    assert data["config"]["benchmark"] == "host" and data["config"]["calls"] == 20
    assert data["provenance"]["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    by = {(r["case"], r["impl"]): r for r in data["results"]}
    flash = by["flash_attention forward, B 1, 16/4 heads, N 2048, d 64", "mta"]
    assert flash["cpu_us"] == pytest.approx(15.0) and len(flash["cpu_us_samples"]) == 3 and flash["gpu_us"] == 7.0
    assert flash["launches"] == 4 and by[flash["case"], "sdpa"]["launches"] == 1
    step = by["MultiTokenAttention.step 6x11, B 8, dim 1024, 16/4 heads, prefix 2048", "mta"]
    assert step["gpu_us"] is None and "capture failed" in step["gpu_error"] and step["status"] == "ok"
    assert step["launches"] is None and "no profiler" in step["launches_error"]
    failed = by["decode_attention, B 1, 32/8 heads, d 128, 16384 keys", "sdpa"]
    assert failed["status"] == "error" and "no room" in failed["error"] and failed["cpu_us"] is None
    verdicts = {t["target"]: t["ok"] for t in data["targets"] if t["ok"] is not None}
    assert verdicts == {"single_launch": True, "conv_forward": True, "flash_forward_backward": True,
                        "conv_forward_backward": True, "layer_step": False}
    assert sum(t["ok"] is None for t in data["targets"]) == 1  # the decode that failed
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "MISSED" in printed and "!!! sdpa at decode_attention, B 1, 32/8 heads, d 128, 16384 keys" in printed

    text = report.section("bench_host.json", data)
    assert text.startswith("## `figures/bench_host.json`: host time per call against SDPA")
    assert ("| flash_attention forward, B 1, 16/4 heads, N 2048, d 64 | 15.0 | 10.0 | 1.50 | 2.0 | pass | 7.0 | 7.0 | "
            "4 | 1 |") in text
    assert ("| MultiTokenAttention.step 6x11, B 8, dim 1024, 16/4 heads, prefix 2048 | 50.0 | 20.0 | 2.50 | 2.0 | "
            "MISSED | - | 7.0 | - | 1 |") in text
    assert "| decode_attention, B 1, 32/8 heads, d 128, 16384 keys | err | err | - | 2.0 | - | - | - | - | - |" in text
    assert "median of 3 loops" in text
    assert report.KINDS.index("host") == report.KINDS.index("model") - 1
    assert report.render({"bench_host.json": data}) == f"{report.PREAMBLE}\n{text}"


def test_plot_host_draws_a_pair_of_bars_per_case_with_the_gpu_work_marked():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = hb.cases(quick=True)[:2]
    results = [{"impl": impl, **vars(s), "case": s.label(), "cpu_us": cpu, "gpu_us": gpu}
               for s in shapes for impl, cpu, gpu in (("mta", 30.0, 12.0), ("sdpa", 10.0, None))]
    data = {"provenance": {"gpu": "Fake GPU"}, "config": {"calls": 20, "repeats": 7, "dtype": "bfloat16"},
            "results": results, "targets": hb.targets(results)}
    fig = plots.plot_host(data)
    try:
        ax = fig.axes[0]
        assert len(ax.patches) == 4 and ax.get_xscale() == "log"
        assert [t.get_text() for t in ax.get_yticklabels()] == [s.label() for s in shapes]
        assert [t.get_text() for t in ax.texts] == ["3.00x (at most 2x)", "3.00x (at most 3x)"]
        assert "Fake GPU" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


# --- the calls it builds ----------------------------------------------------------------------------------------

TINY = (hb.HostShape("flash_attention", False, 1, 2, 1, 16, 16),
        hb.HostShape("conv_attention", True, 1, 2, 2, 16, 16, 2, 3),
        hb.HostShape("decode_attention", False, 2, 2, 1, 16, 16),
        hb.HostShape("conv_decode_attention", False, 2, 2, 1, 16, 16, 2, 3),
        hb.HostShape(hb.STEP, False, 2, 2, 1, 8, 16, 2, 3))


@pytest.mark.parametrize("shape", TINY, ids=lambda s: s.op + ("_bwd" if s.backward else ""))
def test_the_calls_run_and_the_plain_ones_match_sdpa(shape):
    calls = hb.make_calls(shape, DEVICE, torch.float32)
    assert set(calls) == {"mta", "sdpa"}
    outs = {name: call() for name, call in calls.items()}
    if shape.op in ("flash_attention", "decode_attention"):  # the same computation on both sides
        torch.testing.assert_close(outs["mta"], outs["sdpa"], atol=1e-5, rtol=1e-5)
    elif shape.op == hb.STEP:
        assert outs["mta"].shape == outs["sdpa"].shape == (2, 1, 32)
        assert torch.equal(outs["mta"], calls["mta"]())  # the cache is reset: every step is the same step
    elif shape.backward:
        assert outs["mta"] is None and outs["sdpa"] is None  # .backward() returns nothing


# --- the command line -----------------------------------------------------------------------------------------

def test_the_command_line(monkeypatch, capsys, tmp_path):
    from mta.bench.__main__ import build_parser, main
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["host", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--calls" in help_text and "--repeats" in help_text and "--warmup" not in help_text
    args = build_parser().parse_args(["host", "--quick", "--calls", "10", "--repeats", "5"])
    assert (args.calls, args.repeats, args.out) == (10, 5, "figures/bench_host.json")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["host", "--quick", "--out", str(tmp_path / "never.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not (tmp_path / "never.json").exists()
    with pytest.raises(ValueError, match="repeats >= 1"):
        hb.HostBenchmark(repeats=0)

"""The benchmark skeleton and the flash benchmark, on the CPU: FLOP counts, shapes, provenance, the
measuring loop with a fake timer, a whole run (JSON, PNG, exit status), the tables, the figure, and
the command line without a GPU."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import mta
from mta.bench import flash as fb
from mta.bench import harness, plots
from mta.bench.harness import REPO_ROOT, git_info, provenance, source_hash
from mta.course.figures import FIGURES_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_CUDA = not torch.cuda.is_available()


# --- FLOPs and shapes ------------------------------------------------------------------------


def test_forward_flops_is_two_matmuls_and_causal_halves_it():
    B, H, N, D = 3, 5, 256, 64
    full = fb.forward_flops(B, H, N, D, causal=False)
    assert full == 2 * (2 * B * H * N * N * D)  # q k^T and P v, 2 flops per multiply-add
    assert fb.forward_flops(B, H, N, D, causal=True) == full / 2


@pytest.mark.parametrize("causal", [False, True])
def test_backward_flops_are_two_and_a_half_forwards(causal):
    assert fb.backward_flops(2, 4, 512, 128, causal) == 2.5 * fb.forward_flops(2, 4, 512, 128, causal)


def test_tflops():
    assert fb.tflops(3e12, 1000.0) == pytest.approx(3.0)  # 3e12 flops in one second
    assert fb.tflops(1e12, 0.5) == pytest.approx(2000.0)
    assert fb.tflops(1e12, None) is None and fb.tflops(1e12, 0.0) is None and fb.tflops(1e12, -1.0) is None


def test_full_shape_list_matches_the_spec():
    shapes = fb.flash_shapes()
    keys = {(s.dtype, s.head_dim, s.causal, s.seq_len) for s in shapes}
    expected = {(dt, d, c, n) for dt in ("bfloat16", "float16") for d in (64, 128) for c in (False, True)
                for n in (1024, 2048, 4096, 8192, 16384)}
    assert keys == expected and len(shapes) == len(expected)
    for s in shapes:
        assert s.batch * s.seq_len == 16384  # 16k tokens in total at every N
        assert s.heads * s.head_dim == 2048  # heads = 2048 // d
    # Grouped by (dtype, d, causal) with N increasing, so the progress bar and table read in order.
    groups = [(s.dtype, s.head_dim, s.causal) for s in shapes]
    assert [s.seq_len for s in shapes[:5]] == [1024, 2048, 4096, 8192, 16384]
    assert len(set(groups)) == 8 and groups == sorted(groups, key=groups.index)


def test_quick_shapes_are_a_bf16_subset():
    quick = fb.flash_shapes(quick=True)
    assert set(quick) < set(fb.flash_shapes())
    assert {s.dtype for s in quick} == {"bfloat16"}
    assert {s.seq_len for s in quick} == {2048, 8192}
    assert {(s.head_dim, s.causal) for s in quick} == {(64, False), (64, True), (128, False), (128, True)}


# --- provenance and timing -------------------------------------------------------------------


def test_provenance_has_the_required_keys_and_is_json(monkeypatch):
    monkeypatch.delenv("MTA_GIT_COMMIT", raising=False)  # the checkout's own git, not a commit named for a copy
    prov = provenance()
    for key in ("gpu", "cuda", "driver", "torch", "triton", "python", "git_commit", "git_dirty", "utc_time", "argv"):
        assert key in prov, key
    assert prov["torch"] == torch.__version__
    assert prov["argv"] == sys.argv
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", prov["python"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", prov["utc_time"])
    if (REPO_ROOT / ".git").exists():  # a git checkout (a copy without .git, e.g. an archive, has no commit)
        assert re.fullmatch(r"[0-9a-f]{40}", prov["git_commit"])
        assert isinstance(prov["git_dirty"], bool)
    else:
        assert prov["git_commit"] is None and prov["git_dirty"] is None
    if NO_CUDA:
        assert prov["gpu"] == "cpu" and prov["driver"] is None
    json.dumps(prov, allow_nan=False)


def test_git_info_tolerates_a_directory_without_git(tmp_path, monkeypatch):
    monkeypatch.delenv("MTA_GIT_COMMIT", raising=False)
    assert git_info(tmp_path) == {"git_commit": None, "git_dirty": None}
    # A copy of the tree without .git (a rented GPU machine) can be told its commit.
    monkeypatch.setenv("MTA_GIT_COMMIT", "f" * 40)
    assert git_info(tmp_path) == {"git_commit": "f" * 40, "git_dirty": None}


def test_source_hash_follows_the_code(tmp_path):
    (tmp_path / "mta").mkdir()
    module = tmp_path / "mta" / "kernel.py"
    module.write_text("x = 1\n")
    first = source_hash(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{64}", first) and source_hash(tmp_path) == first
    module.write_text("x = 2\n")
    assert source_hash(tmp_path) != first
    assert provenance()["mta_source_sha256"] == source_hash()


@pytest.mark.skipif(not NO_CUDA, reason="checks the no-GPU error")
def test_timing_refuses_to_run_without_cuda():
    from mta.bench.timing import peak_extra_memory_bytes, time_ms
    with pytest.raises(RuntimeError, match="CUDA"):
        time_ms(lambda: None)
    with pytest.raises(RuntimeError, match="CUDA"):
        peak_extra_memory_bytes(lambda: None)


def test_the_spin_lasts_twice_the_launch_time_and_at_least_the_minimum(monkeypatch):
    """The spin before each timed call: twice the second longest host time of launching the call (one stray
    pause does not count), in the spin's cycles, never fewer than LAUNCH_LEAD_CYCLES; ``before_each`` untimed."""
    import time

    from mta.bench import timing
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(timing, "spin_cycles_per_ms", lambda device: 1e6)  # a 1 GHz clock
    waits, resets = iter([0.040, 0.004, 0.010, 0.002, 0.003, 0.001]), []
    lead = timing.launch_lead_cycles(lambda: time.sleep(next(waits)), "cpu", before_each=lambda: resets.append(1))
    assert 2 * 10e6 <= lead < 2 * 25e6 and len(resets) == timing.LAUNCH_PROBES
    assert timing.launch_lead_cycles(lambda: None, "cpu") == timing.LAUNCH_LEAD_CYCLES
    assert timing.timing_config(3, 4)["launch_lead"] == "max(2e6 cycles, 2 x measured launch time)"


class FakeCuda:
    """What the timer asks of torch.cuda, recorded in order: events (elapsed time: 1 ms per event created between
    start and end), the spin, synchronizes, the L2 flush buffer's writes and the memory counters."""

    def __init__(self, monkeypatch, timing):
        self.log, self.events = [], 0
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                fake.events += 1
                self.id = fake.events

            def record(self):
                fake.log.append(("record", self.id))

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return float(end.id - self.id)

        class Flush:
            def zero_(self):
                fake.log.append(("flush",))

        cuda = {"is_available": lambda: True, "current_device": lambda: 0, "Event": Event,
                "_sleep": lambda cycles: self.log.append(("spin", cycles)),
                "synchronize": lambda device=None: self.log.append(("sync",)),
                "memory_allocated": lambda device=None: 100, "max_memory_allocated": lambda device=None: 175,
                "reset_peak_memory_stats": lambda device=None: self.log.append(("reset_peak",))}
        for name, value in cuda.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(timing, "_flush_buffers", {torch.device("cuda", 0): Flush()})
        monkeypatch.setattr(timing, "launch_lead_cycles", lambda fn, device, before_each=None: 12345)


def test_each_timed_call_follows_a_flush_and_a_spin_between_its_events(monkeypatch):
    """``before_each``, the L2 flush and the spin run before the start event, the call between the events; the
    result is the median of the events' times. Peak memory: the counters reset, then the call, then the peak."""
    from mta.bench import timing
    gpu = FakeCuda(monkeypatch, timing)
    ms = timing.time_ms(lambda: gpu.log.append(("call",)), warmup=2, rep=3,
                        before_each=lambda: gpu.log.append(("reset",)))
    assert ms == 3.0  # each start event is 3 creations before its end event: the starts are made first
    timed = [("reset",), ("flush",), ("spin", 12345), ("record", 1), ("call",), ("record", 4)]
    assert gpu.log == [("reset",), ("call",)] * 2 + [("sync",)] + timed + [
        ("reset",), ("flush",), ("spin", 12345), ("record", 2), ("call",), ("record", 5),
        ("reset",), ("flush",), ("spin", 12345), ("record", 3), ("call",), ("record", 6), ("sync",)]
    gpu.log.clear()
    assert timing.peak_extra_memory_bytes(lambda: gpu.log.append(("call",))) == 75
    assert gpu.log == [("sync",), ("reset_peak",), ("call",), ("sync",)]
    with pytest.raises(ValueError, match="rep >= 1"):
        timing.time_ms(lambda: None, rep=0)


def test_the_command_line_times_on_the_current_gpu(monkeypatch):
    """With a GPU, the run gets the CUDA event timer with the given warmup and rep, the memory probe, the current
    device, and the output path; the benchmark's own options reach its constructor."""
    from mta.bench import __main__ as cli
    from mta.bench import timing
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    runs = []
    monkeypatch.setattr(cli, "run_benchmark", lambda bench, tools, **kw: runs.append((bench, tools, kw)) or 1)
    assert cli.main(["conv", "--quick", "--no-compile", "--warmup", "3", "--rep", "4", "--out", "x.json"]) == 1
    bench, tools, kw = runs[0]
    assert not bench.compile_reference and tools.device == torch.device("cuda", 0)
    assert tools.timer.func is timing.time_ms and tools.timer.keywords == {"warmup": 3, "rep": 4}
    assert tools.memory is timing.peak_extra_memory_bytes
    assert kw == {"out": ROOT / "x.json", "quick": True, "warmup": 3, "rep": 4, "resume": False}
    assert cli.main(["startup", "--resume"]) == 1  # not timed: the defaults
    assert runs[1][2] == {"out": ROOT / "figures" / "bench_startup.json", "quick": False, "warmup": 10, "rep": 30,
                          "resume": True}


# --- the measuring loop, on the CPU with a fake timer -----------------------------------------

FWD_MS, FWD_BWD_MS = 2.0, 5.0


def fake_timer(fn, before_each=None):
    """Runs ``fn`` once, as a real timer would, and reports fixed times: forward, or forward+backward."""
    if before_each is not None:
        before_each()
    fn()
    return FWD_MS if before_each is None else FWD_BWD_MS


def exact(q, k, v, causal):
    return mta.naive_attention(q, k, v, causal=causal)


def wrong(q, k, v, causal):
    return mta.naive_attention(q, k, v, causal=not causal)  # the other mask: a plausible bug


def unavailable(q, k, v, causal):
    raise RuntimeError("No available kernel")


def forward_only(q, k, v, causal):
    return exact(q, k, v, causal).detach()  # forward works, backward cannot


TINY = [fb.FlashShape("float16", 16, causal, 64, batch=2, heads=3) for causal in (False, True)]


def run_tiny(impls, shapes=TINY):
    torch.manual_seed(0)
    tools = harness.Tools(timer=fake_timer, memory=None, device="cpu", warn=print)
    return harness.run_shapes(fb.FlashBenchmark(impls), shapes, tools, progress=False)


def test_records_carry_times_tflops_and_a_passing_check():
    results = run_tiny({"mta": exact, "sdpa_flash": exact})
    assert len(results) == 2 * len(TINY)
    for r in results:
        flops = fb.forward_flops(r["batch"], r["heads"], r["seq_len"], r["head_dim"], r["causal"])
        assert (r["fwd_ms"], r["fwd_bwd_ms"], r["bwd_ms"]) == (FWD_MS, FWD_BWD_MS, FWD_BWD_MS - FWD_MS)
        assert r["fwd_tflops"] == pytest.approx(flops / (FWD_MS * 1e-3) / 1e12)
        assert r["bwd_tflops"] == pytest.approx(2.5 * flops / ((FWD_BWD_MS - FWD_MS) * 1e-3) / 1e12)
        assert r["error"] is None and r["bwd_error"] is None
        assert ("check" in r) == (r["impl"] == "mta")
    for r in plots.select(results, impl="mta"):
        check = r["check"]
        assert check["ok"], check
        assert check["reference"].startswith("sdpa_")
        assert check["out_rel_err"] < 1e-2 and max(check["grad_rel_err"].values()) < 2e-2


def test_a_wrong_kernel_fails_its_check_and_is_reported(capsys):
    results = run_tiny({"mta": wrong})
    assert [r["check"]["ok"] for r in results] == [False, False]
    assert all(r["check"]["out_rel_err"] > 0.05 for r in results)
    assert capsys.readouterr().out.count("!!! mta FAILS ITS CHECK") == 2
    assert all(line.rstrip().endswith("!") for line in printed_tables(results)[0].splitlines()[3:])


def test_an_unavailable_backend_is_recorded_not_fatal():
    results = run_tiny({"mta": exact, "sdpa_flash": unavailable, "sdpa_cudnn": forward_only}, shapes=TINY[:1])
    by_impl = {r["impl"]: r for r in results}
    dead = by_impl["sdpa_flash"]
    assert dead["fwd_ms"] is dead["fwd_tflops"] is dead["bwd_ms"] is dead["bwd_tflops"] is None
    assert "No available kernel" in dead["error"]
    half = by_impl["sdpa_cudnn"]
    assert half["fwd_ms"] == FWD_MS and half["error"] is None
    assert half["bwd_ms"] is None and half["bwd_error"]
    assert by_impl["mta"]["bwd_ms"] == FWD_BWD_MS - FWD_MS
    assert dead["status"] == half["status"] == "error" and by_impl["mta"]["status"] == "ok"
    json.dumps(harness.json_safe(results), allow_nan=False)


def test_a_crashing_kernel_fails_its_check_with_the_error():
    (record,) = run_tiny({"mta": unavailable}, shapes=TINY[:1])
    assert record["check"]["ok"] is False and "No available kernel" in record["check"]["error"]


def test_json_safe_replaces_non_finite_floats():
    assert harness.json_safe({"a": [1.0, float("inf")], "b": {"c": float("nan")}, "d": "x"}) == \
        {"a": [1.0, None], "b": {"c": None}, "d": "x"}


def test_a_pass_that_fails_ends_the_measuring_of_that_implementation():
    passes = (harness.Pass("a", "a_ms", memory_key="a_bytes"), harness.Pass("b", "b_ms", error_key="b_error"))
    ran, resets = [], []

    def fails():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
    tools = harness.Tools(timer=lambda fn, before_each=None: fn() or 1.5, memory=lambda fn: fn() or 7)
    calls = {"a": (lambda: ran.append("a"), lambda: resets.append("a")), "b": (fails, None)}
    m = harness.measure(calls, passes, tools)
    assert m == {"a_ms": 1.5, "a_bytes": 7, "error": None, "b_ms": None, "b_error": m["b_error"], "status": "oom"}
    assert "out of memory" in m["b_error"] and ran == ["a", "a"] and len(resets) == 2
    m = harness.measure({"a": (fails, None), "b": calls["a"]}, passes, tools)
    assert m["status"] == "oom" and m["a_ms"] is m["b_ms"] is None and m["error"] and ran == ["a", "a"]


def test_wall_time_per_call_is_recorded_beside_the_gpu_time():
    """With a wall timer, each pass also records its wall time per call under ``<stem>_wall_ms``, timed after the
    GPU time with the same reset before each call."""
    passes = (harness.Pass("fwd", "fwd_ms", memory_key="fwd_bytes"), harness.Pass("decode", "ms"))
    walls, resets = [], []

    def wall(fn, before_each=None):
        walls.append(before_each)
        fn()
        return 2.5
    tools = harness.Tools(timer=lambda fn, before_each=None: fn() or 1.5, memory=lambda fn: fn() or 7, wall=wall)
    reset = lambda: resets.append(1)  # noqa: E731
    m = harness.measure({"fwd": (lambda: None, reset), "decode": (lambda: None, None)}, passes, tools)
    assert (m["fwd_ms"], m["fwd_wall_ms"], m["fwd_bytes"], m["ms"], m["wall_ms"]) == (1.5, 2.5, 7, 1.5, 2.5)
    assert walls == [reset, None] and [p.wall_key for p in passes] == ["fwd_wall_ms", "wall_ms"]


# --- a whole run on the CPU: JSON, PNG, exit status -------------------------------------------


class TinyFlash(fb.FlashBenchmark):
    def shapes(self, quick):
        return TINY


def test_a_run_writes_json_and_png_and_exits_0(tmp_path, capsys):
    out = tmp_path / "bench_flash.json"
    tools = harness.Tools(timer=fake_timer, memory=None, device="cpu", warn=print)
    status = harness.run_benchmark(TinyFlash({"mta": exact, "sdpa_flash": unavailable}), tools, out=out,
                                   progress=False)
    assert status == 0
    data = json.loads(out.read_text())
    assert set(data) == {"provenance", "config", "complete", "results", "summary"} and data["complete"]
    assert data["config"] == fb.FlashBenchmark().config(False, 10, 30)
    assert len(data["results"]) == 4 and data["provenance"]["mta_source_sha256"] == source_hash()
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "TFLOPS" in printed and "median mta/baseline" in printed and "!!!" not in printed


def test_a_failed_check_makes_the_exit_status_1_and_is_printed_again_at_the_end(tmp_path, capsys):
    tools = harness.Tools(timer=fake_timer, memory=None, device="cpu", warn=print)
    status = harness.run_benchmark(TinyFlash({"mta": wrong}), tools, out=tmp_path / "x.json", progress=False)
    assert status == 1
    assert capsys.readouterr().out.count("!!! mta FAILS ITS CHECK at float16 d=16") == 2 * len(TINY)


# --- tables, summary and figure from synthetic results ---------------------------------------


def synthetic_results(dtype="bfloat16"):
    """mta at 300 (fwd) / 200 (bwd) TFLOPS, flash at 250 / 160, cudnn at 400 / 250; mta wrong at d=64 causal N=8192."""
    speeds = {"mta": (300.0, 200.0), "sdpa_flash": (250.0, 160.0), "sdpa_cudnn": (400.0, 250.0)}
    results = []
    for d in (64, 128):
        for causal in (False, True):
            for n in (1024, 2048, 8192):
                for impl, (fwd, bwd) in speeds.items():
                    r = {"impl": impl, "dtype": dtype, "head_dim": d, "causal": causal, "seq_len": n,
                         "batch": 16384 // n, "heads": 2048 // d, "fwd_tflops": fwd + n / 1024, "bwd_tflops": bwd}
                    if impl == "sdpa_cudnn" and n == 1024:
                        r["fwd_tflops"] = r["bwd_tflops"] = None  # as if cuDNN refused the shape
                    if impl == "mta":
                        r["check"] = {"ok": not (d == 64 and causal and n == 8192)}
                    results.append(r)
    prov = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.x", "triton": "3.x", "git_commit": "ab" * 20,
            "git_dirty": True}
    return {"provenance": prov, "config": {"total_tokens": 16384, "model_dim": 2048}, "results": results}


def test_median_ratios_skip_short_sequences():
    summary = fb.FlashBenchmark().summarize(synthetic_results()["results"])["summary"]
    assert len(summary) == 4
    for s in summary:
        # Only N in {2048, 8192} count: fwd ratios (302/252, 308/258) and (302/402, 308/408).
        assert s["fwd_vs_sdpa_flash"] == pytest.approx((302 / 252 + 308 / 258) / 2)
        assert s["bwd_vs_sdpa_flash"] == pytest.approx(200 / 160)
        assert s["fwd_vs_sdpa_cudnn"] == pytest.approx((302 / 402 + 308 / 408) / 2)
        assert s["bwd_vs_sdpa_cudnn"] == pytest.approx(200 / 250)
    assert "1.25" in printed_tables([], summary)[1]


def printed_tables(results, summary=()):
    """The report's tables (title, header, rule, rows): TFLOPS per shape, then the summary's medians."""
    return fb.FlashBenchmark().report({"results": results, "summary": list(summary)}).split("\n\n")


def test_table_has_one_row_per_shape_with_ratios():
    lines = printed_tables(synthetic_results()["results"])[0].splitlines()
    rows = lines[3:]
    assert len(rows) == 12
    row = next(line for line in rows if re.match(r"bfloat16\s+128 True\s+2048 ", line))
    assert "302.0" in row and f"{302 / 252:.2f}" in row and f"{200 / 250:.2f}" in row
    short = next(line for line in rows if re.match(r"bfloat16\s+64 False\s+1024 ", line))
    assert short.count("-") >= 4  # cuDNN missing: its two cells and both mta/cudnn ratios


def files_under(*dirs):
    return {p for d in dirs if d.exists() for p in d.rglob("*")}


def test_plot_flash_draws_the_grid_and_writes_nothing(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    before = files_under(FIGURES_DIR, tmp_path)
    data = synthetic_results()
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    before.add(path)
    fig = plots.plot_flash(path)
    try:
        assert files_under(FIGURES_DIR, tmp_path) == before
        axes = fig.axes
        assert len(axes) == 8  # rows fwd/bwd x columns (d, causal)
        titles = [ax.get_title() for ax in axes]
        assert titles[0] == "forward, d=64, non-causal" and titles[-1] == "backward, d=128, causal"
        fwd_d128 = axes[2]
        lines = {line.get_label(): line for line in fwd_d128.get_lines()}
        assert set(lines) == {"mta (Triton)", "SDPA flash", "SDPA cuDNN"}
        assert list(lines["mta (Triton)"].get_xdata()) == [1024, 2048, 8192]
        assert list(lines["mta (Triton)"].get_ydata()) == [301.0, 302.0, 308.0]
        assert list(lines["SDPA cuDNN"].get_xdata()) == [2048, 8192]  # the missing point is left out
        # The failed check (d=64, causal, N=8192) is crossed out on both rows of its column.
        for ax in (axes[1], axes[5]):
            (cross,) = [line for line in ax.get_lines() if line.get_label() == "mta check failed"]
            assert list(cross.get_xdata()) == [8192]
        assert not any(line.get_label() == "mta check failed" for line in axes[0].get_lines())
        # Each row starts at 0 and shows its highest point (cuDNN's 408 forward, 250 backward).
        for ax, highest in ((axes[0], 408.0), (axes[7], 250.0)):
            bottom, top = ax.get_ylim()
            assert bottom == 0 and highest < top < 1.2 * highest
        assert "NVIDIA H100" in fig._suptitle.get_text() and "abababab+dirty" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_plot_flash_rejects_a_missing_dtype():
    with pytest.raises(ValueError, match="float16"):
        plots.plot_flash(synthetic_results("bfloat16"), dtype="float16")
    with pytest.raises(ValueError, match="missing"):
        plots.load_results({"results": []})


# --- command line ----------------------------------------------------------------------------


def test_cli_without_cuda_exits_2_with_a_clear_message(tmp_path):
    """A real process without a GPU (the other benchmarks take the same path: see the next test)."""
    out = tmp_path / "never.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "mta.bench", "flash", "--quick", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "no CUDA device" in done.stderr and "flash" in done.stderr
    assert not out.exists() and not out.with_suffix(".png").exists()


@pytest.mark.parametrize("name", ["flash", "conv", "order", "startup", "decode"])
def test_every_benchmark_exits_2_without_cuda(name, tmp_path, monkeypatch, capsys):
    from mta.bench.__main__ import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "never.json"
    assert main([name, "--quick", "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not out.exists()


def test_cli_help_lists_every_benchmark(capsys):
    from mta.bench.__main__ import build_parser
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("flash", "conv", "order", "startup"))


def test_cli_common_args():
    from mta.bench.__main__ import build_parser
    args = build_parser().parse_args(["order", "--quick", "--resume", "--warmup", "3", "--rep", "4"])
    assert args.quick and args.resume and (args.warmup, args.rep) == (3, 4) and args.bench.name == "order"
    args = build_parser().parse_args(["startup"])
    assert not hasattr(args, "warmup") and args.out == "figures/bench_startup.json"


def test_cli_resolves_relative_out_against_the_repository_root():
    from mta.bench.__main__ import build_parser, repo_path
    args = build_parser().parse_args(["flash"])
    assert repo_path(args.out) == ROOT / "figures" / "bench_flash.json"
    assert repo_path("/abs/x.json") == pathlib.Path("/abs/x.json")


def test_git_commit_from_the_environment_wins_over_a_stale_checkout(monkeypatch):
    monkeypatch.setenv("MTA_GIT_COMMIT", "e" * 40)
    assert git_info() == {"git_commit": "e" * 40, "git_dirty": None}

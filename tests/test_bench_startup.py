"""The startup benchmark on the CPU: the probe (in this process and once in a real fresh one), the
orchestration with a fake runner (empty then warm cache in one new directory, failures), the table,
the figure and a whole run."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from mta.bench import harness, plots
from mta.bench import startup as sb
from mta.bench import startup_probe as probe

TINY = sb.StartupShape("flash_forward", "float32", 16, batch=1, heads=2, kv_heads=1, seq_len=16)


# --- the probe -------------------------------------------------------------------------------


def probe_line(capsys, *argv) -> dict:
    assert probe.main([str(a) for a in argv]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    return json.loads(line)


@pytest.mark.parametrize("case", [c.name for c in probe.CASES])
def test_every_case_runs_in_the_probe(case, capsys):
    """In this process (imports already done), at a tiny shape: every public function's case works."""
    result = probe_line(capsys, case, "float32", 16, "--seq-len", 16, "--heads", 2, "--kv-heads", 1)
    assert result["finite"] is True
    assert 0 < result["first_call_s"] < 60 and 0 < result["second_call_s"] < 60
    assert result["import_torch_s"] >= 0 and result["import_mta_s"] >= 0 and "device" in result


def test_the_probe_skips_bfloat16_in_the_interpreter(capsys):
    from mta import runtime
    if not runtime.INTERPRET:
        pytest.skip("bfloat16 runs on a GPU")
    result = probe_line(capsys, "conv_forward", "bfloat16", 16, "--seq-len", 16)
    assert "bfloat16" in result["skipped"] and "first_call_s" not in result


def test_the_cases_and_shapes():
    assert [c.name for c in probe.CASES] == ["flash_forward", "flash_forward_backward", "conv_forward",
                                             "conv_forward_backward", "decode_forward", "conv_decode_forward"]
    full, quick = sb.startup_shapes(), sb.startup_shapes(quick=True)
    assert len(full) == 6 * 3 * 2 and len(quick) == 6 * 2 * 1
    assert {(s.dtype, s.head_dim) for s in quick} == {("bfloat16", 128), ("float32", 128)}
    assert {(s.batch, s.heads, s.kv_heads, s.seq_len) for s in full} == {(1, 8, 2, 1536)}


def test_one_real_probe_in_a_fresh_process(tmp_path):
    """End to end: a new Python process, its JSON line, its wall time; the cache directory is the one given."""
    result = sb.run_probe(TINY, tmp_path, timeout=120)
    assert "error" not in result, result.get("stderr_tail")
    assert result["finite"] is True and result["first_call_s"] > 0 and result["second_call_s"] > 0
    # torch and mta are imported inside the probe's clock, not before it (the script does not import mta first).
    assert result["import_torch_s"] > 0.05 and result["import_mta_s"] > 0.01
    assert result["process_s"] > result["import_torch_s"] + result["first_call_s"]


def test_a_failing_probe_is_a_result_with_its_stderr(tmp_path):
    result = sb.run_probe(sb.StartupShape("no_such_case", "float32", 16), tmp_path, timeout=60)
    assert result["error"] == "the probe exited with status 2" and "invalid choice" in result["stderr_tail"]


# --- orchestration with a fake runner --------------------------------------------------------


class FakeRunner:
    """Records the cache directory of each call; the first call of a shape finds it empty and fills it."""

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def __call__(self, shape, cache_dir):
        cache = pathlib.Path(cache_dir)
        empty = not any(cache.iterdir())
        self.calls.append((shape, str(cache), empty))
        (cache / "kernel.cubin").write_text("x")
        if self.fail == (shape.case, empty):
            return {"process_s": 1.0, "error": "the probe exited with status 1",
                    "stderr_tail": "Traceback ...\nRuntimeError: out of resource: shared memory"}
        first = 10.0 if empty else 1.0
        return {"import_torch_s": 1.0, "import_mta_s": 0.5, "first_call_s": first * (1 + shape.head_dim / 128),
                "second_call_s": 0.001, "finite": True, "process_s": first + 2}


TOOLS = harness.Tools(timer=None, memory=None, device="cpu", warn=print)


def test_each_shape_runs_empty_then_warm_in_one_new_directory():
    runner = FakeRunner()
    bench = sb.StartupBenchmark(runner=runner)
    shapes = sb.startup_shapes(quick=True)
    results = harness.run_shapes(bench, shapes, TOOLS, progress=False)
    assert [r["case"] for r in results] == [s.case for s in shapes]
    assert [empty for _, _, empty in runner.calls] == [True, False] * len(shapes)
    dirs = [d for _, d, _ in runner.calls]
    assert all(dirs[i] == dirs[i + 1] for i in range(0, len(dirs), 2))  # warm: the same directory again
    assert not any(os.path.exists(d) for d in dirs)  # removed afterwards
    r = results[0]
    assert r["empty_cache"]["first_call_s"] == 20.0 and r["warm_cache"]["first_call_s"] == 2.0
    assert r["check"] == {"ok": True, "error": None} and bench.shape_of(r) == shapes[0]


def test_a_failed_probe_is_recorded_printed_and_fails_the_run(tmp_path, capsys):
    class Quick(sb.StartupBenchmark):
        def shapes(self, quick):
            return sb.startup_shapes(quick=True)

    out = tmp_path / "bench_startup.json"
    runner = FakeRunner(fail=("conv_forward", True))
    assert harness.run_benchmark(Quick(runner=runner), TOOLS, out=out, quick=True, progress=False) == 1
    data = json.loads(out.read_text())
    failed = [r for r in data["results"] if not r["check"]["ok"]]
    assert [(r["case"], r["dtype"]) for r in failed] == [("conv_forward", "bfloat16"), ("conv_forward", "float32")]
    assert "out of resource" in failed[0]["check"]["error"] and "empty_cache" in failed[0]["check"]["error"]
    assert failed[0]["warm_cache"]["first_call_s"] == 2.0  # the warm run still ran
    printed = capsys.readouterr().out
    assert printed.count("!!! startup FAILS ITS CHECK at conv_forward") == 2 * 2  # at once, and again at the end
    assert data["config"]["cases"]["conv_forward"] == "conv_attention forward (6x11)"
    assert out.with_suffix(".png").stat().st_size > 0
    # A non-finite output fails too.
    assert not sb.startup_check({"empty_cache": {"finite": False}, "warm_cache": {"finite": True}})["ok"]


def synthetic(fail=None):
    runner = FakeRunner(fail=fail)
    bench = sb.StartupBenchmark(runner=runner)
    results = harness.run_shapes(bench, sb.startup_shapes(), TOOLS, progress=False)
    prov = {"gpu": "NVIDIA H100", "torch": "2.x", "triton": "3.x", "git_commit": "ef" * 20}
    return {"provenance": prov, "config": bench.config(False, 0, 0), "results": harness.json_safe(results)}


def test_table_shows_seconds_per_case():
    lines = sb.StartupBenchmark().report(synthetic(fail=("flash_forward", False))).splitlines()
    assert len(lines) == 3 + 36
    rows = {tuple(line.split()[:3]): line.split()[3:] for line in lines[3:]}
    # import (torch + mta), first call with an empty cache, with a warm one, second call.
    assert rows[("flash_forward_backward", "float16", "128")] == ["1.50", "20.000", "2.000", "0.0010"]
    # A failed warm run: the numbers of the run that worked, a dash, and the mark.
    assert rows[("flash_forward", "float32", "64")] == ["1.50", "15.000", "-", "0.0010", "!"]
    assert sum(cells[-1] == "!" for cells in rows.values()) == 6


def test_plot_startup_groups_bars_by_case_and_dtype_per_head_dim(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "bench_startup.json"
    path.write_text(json.dumps(synthetic(fail=("conv_forward", True))))
    fig = plots.plot_startup(path)
    try:
        assert len(fig.axes) == 2 and all(ax.get_yscale() == "log" for ax in fig.axes)
        assert [ax.get_title() for ax in fig.axes] == ["head dim 64", "head dim 128"]
        ax = fig.axes[1]
        assert len(ax.get_xticks()) == 18  # 6 cases x 3 dtypes
        heights = sorted(p.get_height() for p in ax.patches)
        assert len(heights) == 2 * 18 - 3  # the failed empty-cache runs of conv have no bar
        assert heights[0] == 2.0 and heights[-1] == 20.0
        assert sum(t.get_text() == "failed" for t in ax.texts) == 3
        assert "NVIDIA H100" in fig._suptitle.get_text() and "N=1536" in fig._suptitle.get_text()
    finally:
        plt.close(fig)

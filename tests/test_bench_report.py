"""docs/performance.md is what ``python -m mta.bench report`` renders from the committed figures/bench_*.json (so it
cannot go stale), and the renderer puts each number of a benchmark's JSON where it belongs. CPU only, no kernels."""

from __future__ import annotations

import json
from pathlib import Path

from mta.bench import report
from mta.bench.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_page_is_the_render_of_the_committed_results():
    files = report.load(ROOT / report.FIGURES)
    assert files, "no figures/bench_*.json"
    committed = (ROOT / report.OUT).read_text()
    assert committed == report.render(files), "docs/performance.md is stale: run python -m mta.bench report"
    for name in files:
        assert f"## `figures/{name}`" in committed


# --- the renderer on made-up results ------------------------------------------------------------------------------

def provenance(*argv: str) -> dict:
    return {"gpu": "Fake GPU", "cuda": "12.0", "driver": "1.2", "torch": "9.9", "triton": "8.8", "python": "3.0",
            "git_commit": "a" * 40, "git_dirty": True, "mta_source_sha256": "b" * 64,
            "utc_time": "2000-01-02T03:04:05+00:00", "argv": ["/x/mta/bench/__main__.py", *argv]}


def flash_json() -> dict:
    shape = {"dtype": "float16", "head_dim": 64, "causal": True, "seq_len": 8192, "batch": 2, "heads": 32}
    results = [{"impl": "mta", **shape, "fwd_tflops": 123.4, "bwd_tflops": 98.7, "status": "ok",
                "check": {"ok": True}},
               {"impl": "sdpa_flash", **shape, "fwd_tflops": 45.0, "bwd_tflops": 40.2, "status": "ok"},
               {"impl": "sdpa_cudnn", **shape, "fwd_tflops": None, "bwd_tflops": None, "status": "error"}]
    summary = [{"dtype": "float16", "head_dim": 64, "causal": True, "min_seq_len": 2048, "fwd_vs_sdpa_flash": 2.5,
                "bwd_vs_sdpa_flash": 1.25, "fwd_vs_sdpa_cudnn": None, "bwd_vs_sdpa_cudnn": None}]
    return {"provenance": provenance("flash", "--quick"), "config": {"benchmark": "flash", "total_tokens": 16384,
            "model_dim": 2048}, "complete": True, "results": results, "summary": summary}


def conv_json() -> dict:
    def record(impl, seq_len, fwd, fwd_bwd, mem, mem_bwd, **extra):
        return {"impl": impl, "dtype": "bfloat16", "batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 64, "cq": 6,
                "ck": 11, "seq_len": seq_len, "causal": True, "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd,
                "peak_extra_bytes": mem, "fwd_bwd_peak_extra_bytes": mem_bwd, "status": "ok", **extra}
    results = [record("mta_conv", 8192, 2.0, 10.0, 100, 200, check={"ok": False}),
               record("mta_flash", 8192, 0.5, 2.5, 50, 80),
               record("conv_reference", 8192, 50.0, None, 10000, None, status="skipped"),
               record("mta_conv", 1024, 7.0, 7.0, 7, 7, check={"ok": True})]  # not at the headline length
    return {"provenance": provenance("conv"), "config": {"benchmark": "conv", "dtype": "bfloat16", "causal": True},
            "complete": False, "results": results}


def order_json() -> dict:  # its config names no benchmark: the command line does
    results = [{"kernel": "flash", "heads": 2, "head_dim": 64, "seq_len": n, "speedup": s, "check": {"ok": True}}
               for n, s in ((1024, 1.25), (2048, 0.9))]
    return {"provenance": provenance("order"), "config": {"dtype": "bfloat16"}, "results": results}


def decode_json() -> dict:
    shape = {"batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 64, "seq_len": 65536}
    results = [{"impl": impl, **shape, "us": us, "tbps": tbps}
               for impl, us, tbps in (("mta_decode", 60.25, 2.5), ("sdpa", 61.0, 2.4), ("mta_conv_decode", 70.0, 2.1),
                                      ("read", 80.0, 1.9))]
    summary = [{"batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 64, "min_seq_len": 16384,
                "decode_of_read_tbps": 1.3, "conv_decode_of_read_tbps": 1.1, "sdpa_over_decode_time": 1.0125}]
    return {"provenance": provenance("decode"), "config": {"benchmark": "decode", "kernel": [6, 11]},
            "results": results, "summary": summary}


def startup_json() -> dict:
    results = [{"case": "flash_forward", "dtype": "float32", "head_dim": 128, "check": {"ok": True},
                "empty_cache": {"first_call_s": 2.345}, "warm_cache": {"first_call_s": 0.5}},
               {"case": "flash_forward", "dtype": "bfloat16", "head_dim": 128, "check": {"ok": False},
                "empty_cache": {"error": "timed out"}, "warm_cache": {"first_call_s": 0.4}}]
    return {"provenance": provenance("startup"), "config": {"benchmark": "startup", "cases": {
        "flash_forward": "flash_attention forward"}, "shape": {"batch": 1, "heads": 8, "kv_heads": 2, "seq_len": 1536}},
        "results": results}


def synthetic() -> dict[str, dict]:
    """Made-up results, one file per benchmark, named so that sorting by name would misorder them."""
    return {"bench_a_startup.json": startup_json(), "bench_b_decode.json": decode_json(),
            "bench_c_order.json": order_json(), "bench_d_conv.json": conv_json(), "bench_e_flash.json": flash_json()}


def test_sections_follow_the_benchmarks_order_under_the_preamble():
    page = report.render(synthetic())
    assert page.startswith(report.PREAMBLE)
    heads = [page.index(f"## `figures/bench_{x}.json`") for x in ("e_flash", "d_conv", "c_order", "b_decode",
                                                                     "a_startup")]
    assert heads == sorted(heads)


def test_provenance_names_gpu_software_commit_date_command_and_checks():
    text = report.section("bench_d_conv.json", conv_json())
    for expected in ("GPU: Fake GPU (CUDA 12.0, driver 1.2)", "torch 9.9, Triton 8.8", "commit `aaaaaaaaaa` with "
                     "uncommitted changes to `mta/`", "2000-01-02T03:04:05+00:00, `python -m mta.bench conv`, "
                     "incomplete", "checks: 1 of 2 passed"):
        assert expected in text, expected


def test_flash_tables_take_rates_and_ratios_from_the_json():
    text = report.section("bench_e_flash.json", flash_json())
    assert "| float16 | 64 | causal | 123 | 45 | err | 99 | 40 | err |" in text
    assert "| float16 | 64 | causal | 2.50 | 1.25 | - | - |" in text
    assert "median over N >= 2048" in text and "TFLOPS at N = 8192 (16384 tokens a batch" in text


def test_conv_table_shows_the_headline_length_with_ratios_and_skips():
    text = report.section("bench_d_conv.json", conv_json())
    assert "| 64 | 8 | 6x11 | forward | 2.000 | 0.500 | 50.0 | 4.00x | 25.0x | 1.00% |" in text
    assert "| 64 | 8 | 6x11 | forward+backward | 10.000 | 2.500 | skip | 4.00x | - | - |" in text
    assert "7.000" not in text  # N = 1024 is not the headline


def test_order_decode_and_startup_tables():
    assert "| flash | 2 | 64 | 1.25x | 0.90x |" in report.section("bench_c_order.json", order_json())
    decode = report.section("bench_b_decode.json", decode_json())
    assert "| 1 | 8 | 8 | 64 | 60.2 | 61.0 | 70.0 | 2.50 | 2.10 | 1.90 |" in decode
    assert "| 1 | 8 | 8 | 64 | 1.30 | 1.10 | 1.012 |" in decode and "(6x11)" in decode
    startup = report.section("bench_a_startup.json", startup_json())
    assert "| case | float32 d=128 | bfloat16 d=128 |" in startup
    assert "| flash_attention forward | 2.35 / 0.50 | failed |" in startup


def test_the_command_writes_the_page_and_checks_it(tmp_path, capsys):
    figures, out = tmp_path / "figures", tmp_path / "docs" / "performance.md"
    figures.mkdir()
    for name, data in synthetic().items():
        (figures / name).write_text(json.dumps(data))
    args = ["report", "--figures", str(figures), "--out", str(out)]
    assert main([*args, "--check"]) == 1 and not out.exists()
    assert main(args) == 0
    assert out.read_text() == report.render(synthetic())
    assert main([*args, "--check"]) == 0
    out.write_text(out.read_text().replace("123", "124"))  # a number typed by hand
    assert main([*args, "--check"]) == 1
    assert "stale" in capsys.readouterr().out



def with_wall(data: dict, factor: dict[str, float]) -> dict:
    """``data`` with wall times per call: each record's GPU time (``fwd_ms``, ``fwd_bwd_ms``, decode's ``us``)
    times ``factor[impl]`` under the matching wall key (``fwd_wall_ms``, ``fwd_bwd_wall_ms``, ``wall_ms``)."""
    for r in data["results"]:
        if r["impl"] == "mta":  # the flash records carry rates only: give mta's times, SDPA's stay missing
            r.update(fwd_ms=1.5, fwd_bwd_ms=4.0)
        for gpu, wall, scale in (("fwd_ms", "fwd_wall_ms", 1.0), ("fwd_bwd_ms", "fwd_bwd_wall_ms", 1.0),
                                 ("us", "wall_ms", 1e-3)):
            if gpu in r:
                r[wall] = None if r[gpu] is None else factor[r["impl"]] * r[gpu] * scale
    return data


def test_runs_with_wall_times_get_wall_columns_beside_the_gpu_times():
    flash = report.section("bench_e_flash.json", with_wall(flash_json(), {"mta": 2.0}))
    assert "Milliseconds per call at N = 8192: GPU time (ms) beside wall time per call (wall ms):" in flash
    assert "| mta ms | mta wall ms | SDPA flash ms | SDPA flash wall ms | SDPA cuDNN ms | SDPA cuDNN wall ms |" in flash
    assert "| float16 | 64 | causal | forward | 1.500 | 3.000 | - | - | err | err |" in flash
    assert "| float16 | 64 | causal | forward+backward | 4.000 | 8.000 | - | - | err | err |" in flash
    conv = report.section("bench_d_conv.json", with_wall(conv_json(), {"mta_conv": 3.0, "mta_flash": 2.0,
                                                                       "conv_reference": 1.0}))
    assert "| MTA ms | MTA wall ms | flash ms | flash wall ms | reference ms | reference wall ms | MTA / flash |" in conv
    assert "| 64 | 8 | 6x11 | forward | 2.000 | 6.000 | 0.500 | 1.000 | 50.0 | 50.0 | 4.00x | 25.0x | 1.00% |" in conv
    assert "| 64 | 8 | 6x11 | forward+backward | 10.000 | 30.000 | 2.500 | 5.000 | skip | skip | 4.00x |" in conv
    decode = report.section("bench_b_decode.json", with_wall(decode_json(), {"mta_decode": 4.0, "sdpa": 1.0,
                                                                             "mta_conv_decode": 2.0, "read": 1.0}))
    assert "| decode us | decode wall us | SDPA us | SDPA wall us | MTA decode us | MTA decode wall us |" in decode
    assert "| 1 | 8 | 8 | 64 | 60.2 | 241.0 | 61.0 | 61.0 | 70.0 | 140.0 | 2.50 | 2.10 | 1.90 |" in decode
    for name, data in (("bench_e_flash.json", flash_json()), ("bench_d_conv.json", conv_json()),
                       ("bench_b_decode.json", decode_json())):
        assert "wall" not in report.section(name, data)  # a run from before wall times keeps its tables

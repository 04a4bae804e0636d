"""The decode benchmark on the CPU: shapes, bytes, the exact last-rows reference, the checks (which catch a wrong
decoder), the reference's memory fit, a whole run at tiny shapes with a fake timer (JSON, table, figure)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import DEVICE
from mta.bench import decode as db
from mta.bench import harness
from mta.bench.plots import DECODE_STYLES
from mta.reference import conv_attention_reference

GIB = 2 ** 30


def test_shapes_match_the_spec():
    shapes = db.decode_shapes()
    assert {(s.batch, s.heads, s.kv_heads, s.head_dim) for s in shapes} == \
        {(b, h, hkv, d) for b in (1, 8) for (h, hkv, d) in ((8, 8, 64), (32, 8, 128))}
    assert sorted({s.seq_len for s in shapes}) == [1024 * 2 ** i for i in range(8)]
    assert len(shapes) == 32 and {(s.dtype, s.new_queries) for s in shapes} == {("bfloat16", 1)}
    assert set(db.decode_shapes(quick=True)) < set(shapes)


def test_bytes_are_the_cache_plus_the_query_rows_mta_reads():
    s = db.DecodeShape("bfloat16", 8, 32, 8, 128, 65536)
    kv = 2 * 8 * 8 * 65536 * 128 * 2
    assert db.bytes_read(s, "mta_decode") == db.bytes_read(s, "read") == kv
    assert db.bytes_read(s, "mta_conv_decode") == kv + 8 * 32 * (6 - 1 + 1) * 128 * 2


@pytest.mark.parametrize("N, n", [(3, 1), (40, 1), (40, 3)])
def test_last_rows_reference_is_the_forward_s_last_rows(N, n):
    """fp32 (as the check runs it) against the float64 forward's last rows, fewer rows than the kernel's reach too."""
    q, k, v = torch.randn(2, 4, N, 16, dtype=torch.float64), *torch.randn(2, 2, 2, N, 16, dtype=torch.float64)
    w = 0.2 * torch.randn(4, 6, 11, dtype=torch.float64)
    rows = db.last_rows_reference(q.float(), k.float(), v.float(), w.float(), n)
    assert rows.dtype == torch.float32 and rows.shape == (2, 4, n, 16)
    torch.testing.assert_close(rows.double(), conv_attention_reference(q, k, v, w)[:, :, -n:], rtol=1e-5, atol=1e-6)


def tiny_inputs(N=40):
    shape = db.DecodeShape("float32", 2, 4, 2, 16, N)
    return shape, db.random_inputs(shape, DEVICE)


def test_checks_pass_and_catch_a_wrong_decoder():
    _, x = tiny_inputs()
    impls = db.default_impls()
    for name in db.CHECKED:
        c = db.check(name, impls[name], x)
        assert c["ok"] and c["rel_err"] < 1e-5, c
    wrong = db.check("mta_conv_decode", impls["mta_decode"], x)  # plain attention is not MTA
    assert not wrong["ok"] and wrong["rel_err"] > db.TOLERANCE
    broken = db.check("mta_decode", lambda x: 1 / 0, x)
    assert not broken["ok"] and "ZeroDivisionError" in broken["error"]


def test_reference_runs_only_where_it_fits():
    small, big = db.DecodeShape("bfloat16", 1, 8, 8, 64, 8192), db.DecodeShape("bfloat16", 1, 8, 8, 64, 16384)
    bench = db.DecodeBenchmark(free_bytes=lambda: 79 * GIB)
    assert bench.skip("conv_reference", small, None) == {} and bench.skip("mta_decode", big, None) == {}
    (reason,) = bench.skip("conv_reference", big, None).values()
    assert reason.startswith("not run: the reference needs") and "GiB" in reason


class Tiny(db.DecodeBenchmark):
    def shapes(self, quick):
        return [db.DecodeShape("float32", b, 4, 2, 16, n) for b in (1, 2) for n in (24, 40)]


TOOLS = harness.Tools(timer=lambda fn, before_each=None: fn() is None or 0.01, memory=None, device=DEVICE, warn=print)


#: These tests share a module-scoped fixture: one process runs them all (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("test_bench_decode")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One whole run at the tiny shapes (exit status, JSON path); 60% of the free bytes given hold the reference
    at N = 24, B = 1 only (6 x 4 x 24^2 x 4 bytes)."""
    out = tmp_path_factory.mktemp("decode") / "bench_decode.json"
    status = harness.run_benchmark(Tiny(free_bytes=lambda: 120_000), TOOLS, out=out, progress=False)
    return status, out


def test_a_whole_run_at_tiny_shapes(tiny_run):
    status, out = tiny_run
    assert status == 0
    data = json.loads(out.read_text())
    records = data["results"]
    assert len(records) == 4 * len(db.IMPLS) and data["complete"]
    for r in records:
        assert (r["status"] == "skipped") == (r["impl"] == "conv_reference" and (r["batch"], r["seq_len"]) != (1, 24))
        if r["status"] == "ok":
            assert r["us"] == 10.0 and r["tbps"] == pytest.approx(r["bytes"] / 1e-5 / 1e12)
        assert ("check" in r) == (r["impl"] in db.CHECKED) and r.get("check", {"ok": True})["ok"]
    assert data["summary"] == []  # no N >= 16k here
    summary = harness.median_ratios(records, db.KEYS[:-1], db.SUMMARY_RATIOS, min_seq_len=40)
    assert summary[0]["decode_of_read_tbps"] == pytest.approx(1.0)
    table = db.DecodeBenchmark().report(data).split("\n\n")[0]
    assert "microseconds per decode step" in table and "mta_conv_decode TB/s" in table
    assert not any(line.endswith("!") for line in table.splitlines())
    assert out.with_suffix(".png").stat().st_size > 0


def test_plot_has_time_and_bandwidth_per_configuration(tiny_run):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = db.plot_decode(tiny_run[1])
    try:
        assert len(fig.axes) == 4 and all(ax.get_yscale() == "log" for ax in fig.axes)
        labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
        assert {DECODE_STYLES[name]["label"] for name in db.IMPLS} <= labels
    finally:
        plt.close(fig)

"""The launch-order benchmark's machinery, on any device: natural-order twins of the kernels, the shipped
tile config, one measured shape with a fake timer, and the plot."""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from mta import runtime
from mta.launch_order import heaviest_first
from mta.bench import launch_order as lo
from mta.bench.harness import Tools
from mta.bench.launch_order import conv_launch, flash_launch, run_as, shipped_tile, with_natural_order
from mta.bench.plots import plot_launch_order
from mta.conv_forward import conv_forward_kernel
from mta.flash_forward import flash_forward_kernel


def qkv(heads, n, d):
    return (torch.randn(1, heads, n, d, device=runtime.DEVICE) for _ in range(3))


def test_flash_forward_twin_gives_the_same_output():
    torch.manual_seed(0)
    q, k, v = qkv(2, 53, 32)
    made, out = flash_launch(q, k, v)
    twin = with_natural_order(flash_forward_kernel)
    assert twin.fn.__annotations__ == flash_forward_kernel.fn.__annotations__  # the constexpr marks
    assert torch.equal(run_as(made, flash_forward_kernel, out), run_as(made, twin, out))


def test_conv_forward_twin_gives_the_same_output():
    torch.manual_seed(0)
    q, k, v = qkv(2, 41, 16)
    made, out = conv_launch(q, k, v, torch.randn(2, 6, 11, device=runtime.DEVICE) * 0.2)
    o = run_as(made, conv_forward_kernel, out)
    assert torch.isfinite(o).all()
    assert torch.equal(o, run_as(made, with_natural_order(conv_forward_kernel), out))


@triton.jit
def _tile_of_program(HEAVY_LAST: tl.constexpr):
    return heaviest_first(HEAVY_LAST)  # a helper between the kernel and heaviest_first, as in mta.kernel_parts


@triton.jit
def _record_tiles(Out, HEAVY_LAST: tl.constexpr):
    tile, pid_bh = _tile_of_program(HEAVY_LAST)
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    tl.store(Out + 2 * pid, tile)
    tl.store(Out + 2 * pid + 1, pid_bh)


def test_the_twin_numbers_tiles_the_natural_way_also_through_helpers():
    tiles, heads = 3, 2
    shipped, twin = (torch.full((tiles * heads, 2), -1, dtype=torch.int32, device=runtime.DEVICE) for _ in range(2))
    _record_tiles[(tiles, heads)](shipped, HEAVY_LAST=True)
    with_natural_order(_record_tiles)[(tiles, heads)](twin, HEAVY_LAST=True)
    # Program p = (axis 0, axis 1) in launch order: the twin's tile is axis 0, the shipped one's the heaviest left.
    assert twin.tolist() == [[t, h] for h in range(heads) for t in range(tiles)]
    assert shipped.tolist() == [[2, 0], [2, 1], [1, 0], [1, 1], [0, 0], [0, 1]]
    assert _tile_of_program.fn.__globals__["heaviest_first"] is heaviest_first  # the original is untouched
    with pytest.raises(ValueError, match="never calls heaviest_first"):
        with_natural_order(_plain)


@triton.jit
def _plain(X, BLOCK: tl.constexpr):
    tl.store(X + tl.arange(0, BLOCK), tl.zeros([BLOCK], dtype=tl.float32))


@pytest.mark.parametrize("head_dim,cq", [(64, 6), (64, 11), (80, 6)])
def test_the_twin_runs_the_shipped_launch_and_tile(head_dim, cq):
    """The benchmark times the launch the package makes, kernel swapped: the same tile the launcher takes."""
    from mta.conv import conv_forward_config
    q, k, v = (torch.randn(1, 2, 20, head_dim, dtype=torch.float16, device=runtime.DEVICE) for _ in range(3))
    made, _ = conv_launch(q, k, v, torch.randn(2, cq, 11, device=runtime.DEVICE) * 0.2)
    assert made.kernel is conv_forward_kernel
    assert shipped_tile(made) == shipped_tile(dataclasses.replace(made, meta=conv_forward_config(q, cq, True)))


@pytest.mark.parametrize("kernel", ["flash", "conv"])
def test_a_shape_is_checked_then_timed_in_both_orders(kernel):
    timed = []

    def timer(fn, before_each=None):
        timed.append(fn())
        return 2.0 if len(timed) == 1 else 1.0  # natural first, then heaviest first
    torch.manual_seed(0)
    bench = lo.LaunchOrderBenchmark(dtype="float32")
    shape = lo.OrderShape(kernel, 2, 16, 40)
    (rec,) = bench.measure_shape(shape, Tools(timer=timer, memory=None, device=runtime.DEVICE, warn=print))
    assert len(timed) == 2 and torch.equal(timed[0], timed[1])
    assert rec["same_output"] is True and rec["check"] == {"ok": True, "error": None}
    assert (rec["natural_ms"], rec["heaviest_first_ms"], rec["speedup"]) == (2.0, 1.0, 2.0)
    assert {k: rec[k] for k in ("kernel", "heads", "head_dim", "seq_len")} == vars(shape)
    assert set(rec["config"]) >= {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}
    assert bench.shape_of(rec) == shape


def test_shapes_keep_the_order_of_the_committed_results():
    shapes = lo.LaunchOrderBenchmark().shapes(quick=True)
    assert [(s.kernel, s.heads, s.seq_len) for s in shapes[:4]] == \
        [("flash", 8, 2048), ("conv", 8, 2048), ("flash", 8, 8192), ("conv", 8, 8192)]
    assert len(lo.LaunchOrderBenchmark().shapes(quick=False)) == 2 * 2 * 5


def test_plot_launch_order_draws_one_panel_per_kernel():
    results = [{"kernel": kernel, "heads": h, "head_dim": d, "seq_len": n, "speedup": 1.0 + n / 1e5}
               for kernel in ("flash", "conv") for h, d in ((8, 64), (16, 128)) for n in (1024, 4096)]
    fig = plot_launch_order({"provenance": {"gpu": "test"}, "config": {}, "results": results})
    assert len(fig.axes) == 2
    assert [len(ax.lines) for ax in fig.axes] == [3, 3]  # two shapes and the line at 1
    with pytest.raises(ValueError, match="missing"):
        plot_launch_order({"results": []})

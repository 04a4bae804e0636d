"""The launch-order benchmark's machinery, on any device: natural-order twins of the kernels and the plot."""

import pytest
import torch

from mta import runtime
from mta.bench.launch_order import conv_launcher, flash_launcher, untuned, with_natural_order
from mta.bench.plots import plot_launch_order
from mta.conv_forward import conv_forward_kernel
from mta.flash_forward import flash_forward_kernel


def qkv(heads, n, d):
    return (torch.randn(1, heads, n, d, device=runtime.DEVICE) for _ in range(3))


def test_flash_forward_twin_gives_the_same_output():
    torch.manual_seed(0)
    launch = flash_launcher(*qkv(2, 53, 32))
    cfg = flash_forward_kernel.configs[0]
    twin = with_natural_order(flash_forward_kernel)
    assert twin.fn.__annotations__ == untuned(flash_forward_kernel).fn.__annotations__  # the constexpr marks
    assert torch.equal(launch(untuned(flash_forward_kernel), cfg), launch(twin, cfg))


def test_conv_forward_twin_gives_the_same_output():
    torch.manual_seed(0)
    q, k, v = qkv(2, 41, 16)
    launch = conv_launcher(q, k, v, torch.randn(2, 6, 11, device=runtime.DEVICE) * 0.2)
    cfg = conv_forward_kernel.configs[0]
    o = launch(untuned(conv_forward_kernel), cfg)
    assert torch.isfinite(o).all()
    assert torch.equal(o, launch(with_natural_order(conv_forward_kernel), cfg))


def test_plot_launch_order_draws_one_panel_per_kernel():
    results = [{"kernel": kernel, "heads": h, "head_dim": d, "seq_len": n, "speedup": 1.0 + n / 1e5}
               for kernel in ("flash", "conv") for h, d in ((8, 64), (16, 128)) for n in (1024, 4096)]
    fig = plot_launch_order({"provenance": {"gpu": "test"}, "config": {}, "results": results})
    assert len(fig.axes) == 2
    assert [len(ax.lines) for ax in fig.axes] == [3, 3]  # two shapes and the line at 1
    with pytest.raises(ValueError, match="missing"):
        plot_launch_order({"results": []})

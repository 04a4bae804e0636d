"""Heads whose positions span 2**31 elements: the flash and MTA kernels index positions in int32 (batch and head
offsets in int64), so the launchers copy such a view contiguous first (:func:`mta.launch.within_int32_indexing`).
The layer passes ``[B, N, H, D]`` views: position stride ``H D``, which passes 2**31 at 512k tokens x 32 heads of
128. Before the fix ``position * stride`` wrapped around: reads from before the buffer, a segfault in the
interpreter and an illegal memory access on a GPU (hence the child process)."""

import sys

import pytest
import torch

from conftest import DEVICE, mta, run_child_case, wide_views
from mta.reference import conv_attention_reference, naive_attention

TOL16 = dict(atol=2e-3, rtol=2e-3)


def _wide_case() -> None:
    """``q, k, v [1, 3, 5, 16]`` fp16 with a position stride of 2**29 (position 4 starts 2**31 elements in), views
    of one lazily allocated buffer: only the positions used are touched. Forward and gradients of
    ``flash_attention`` and ``conv_attention`` against float64 autograd on contiguous copies."""
    D, L = 16, 5
    wide = wide_views(4 * L * D)
    if wide is None:
        return
    rnd = torch.Generator(device="cpu").manual_seed(1)

    def view(offset):
        return wide((1, 3, L, D), (0, D, 2 ** 29, 1), offset).requires_grad_()

    q, k, v = view(0), view(3 * D), view(6 * D)
    w = (0.3 * torch.randn(3, 3, 5, generator=rnd)).to(DEVICE).requires_grad_()
    dout = torch.randn(1, 3, L, D, generator=rnd).half().to(DEVICE)
    for name, fn, ref, args in (("flash", mta.flash_attention, naive_attention, (q, k, v)),
                                ("conv", mta.conv_attention, conv_attention_reference, (q, k, v, w))):
        out = fn(*args, causal=True)
        grads = torch.autograd.grad(out, args, dout)
        leaves = [t.detach().double().cpu().requires_grad_() for t in args]
        want = ref(*leaves, causal=True)
        want_grads = torch.autograd.grad(want, leaves, dout.double().cpu())
        torch.testing.assert_close(out.double().cpu(), want, **TOL16, msg=name)
        for g, g64 in zip(grads, want_grads):
            torch.testing.assert_close(g.double().cpu(), g64, **TOL16, msg=name)
    print("OK")


def test_a_head_spanning_2_to_the_31_elements_is_read_as_a_contiguous_copy():
    run_child_case(__file__, "wide")


def test_a_head_that_no_copy_brings_under_2_to_the_31_is_refused_by_name():
    # MTA keeps cq folded copies of a head's keys: 8 x 2**24 positions x 16 reaches 2**31 (stride-0 views: no memory).
    n, d = 2 ** 24, 16
    q = torch.ones(1, 1, 1, d, device=DEVICE).expand(1, 1, n, d)
    w = torch.ones(1, 8, 1, device=DEVICE)
    with pytest.raises(ValueError, match=r"16777216 positions x head dim 16 x 8 folded copies span 2\*\*31"):
        mta.conv_attention(q, q, q, w)


if __name__ == "__main__" and sys.argv[1:] == ["wide"]:
    _wide_case()

"""The fused attention Functions (``mta.flash.KernelFunction``): a plain call applies the eager twin (``ctx`` in its
forward), ``torch.func``'s transforms the Function itself (``setup_context`` apart), both with the same gradients;
the lse output's gradient is never materialized."""

from __future__ import annotations

import pytest
import torch

import mta
from conftest import DEVICE, rand
from mta.conv import ConvAttention
from mta.flash import FlashAttention

B, HQ, HKV, N, D = 1, 2, 1, 9, 8


def calls():
    """``(Function, call)``: each fused op on fresh inputs that require grad, as ``call(q, k, v, w)``."""
    return [(FlashAttention, lambda q, k, v, w: mta.flash_attention(q, k, v, causal=True)),
            (ConvAttention, lambda q, k, v, w: mta.conv_attention(q, k, v, w))]


def inputs():
    q, k, v = rand(B, HQ, N, D), rand(B, HKV, N, D), rand(B, HKV, N, D)
    w = 0.3 * torch.randn(HQ, 2, 3, device=DEVICE)
    return [t.requires_grad_() for t in (q, k, v, w)]


@pytest.mark.parametrize("function, call", calls(), ids=["flash", "conv"])
def test_a_plain_call_records_the_eager_twin_under_the_functions_name(function, call):
    o = call(*inputs())
    assert type(o.grad_fn)._forward_cls is function.eager
    assert type(o.grad_fn).__name__ == f"{function.__name__}Backward"


@pytest.mark.parametrize("function, call", calls(), ids=["flash", "conv"])
def test_the_transforms_gradients_are_the_plain_calls(function, call):
    q, k, v, w = inputs()
    do = rand(B, HQ, N, D)
    call(q, k, v, w).backward(do)
    plain = [t.grad for t in (q, k, v, w)]
    used = 4 if function is ConvAttention else 3
    transformed = torch.func.grad(lambda *x: (call(*x) * do).sum(), argnums=tuple(range(used)))(
        *(t.detach() for t in (q, k, v, w)))
    for got, want in zip(transformed, plain):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("function, call", calls(), ids=["flash", "conv"])
def test_no_output_gradient_gives_no_input_gradients(function, call):
    o = call(*inputs())
    assert all(g is None for g in o.grad_fn.apply(None, None))

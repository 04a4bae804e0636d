"""The plain-PyTorch references against independent float64 formulas."""

from __future__ import annotations

import math

import pytest
import torch

import mta
from conftest import rand, rand_qkv

F64 = torch.float64


def attention_by_loops(q, k, v, causal, scale):
    """Row by row, key by key, in float64: an independent definition of attention."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    o = torch.zeros(B, Hq, Nq, D, dtype=F64)
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            for i in range(Nq):
                visible = [j for j in range(Nk) if not causal or j <= i + Nk - Nq]
                if not visible:
                    continue
                s = torch.tensor([scale * float(q[b, h, i] @ k[b, kh, j]) for j in visible], dtype=F64)
                p = torch.exp(s - s.max())
                o[b, h, i] = (p / p.sum()) @ v[b, kh, visible]
    return o


def conv_scores_by_double_sum(q, k, weight, causal, scale):
    """``C[i, j] = sum_a sum_b w[a, b] * S0[i - (cq-1) + a, j - (ck-1)/2 + b]``, literally, in float64."""
    B, Hq, N, _ = q.shape
    Hkv = k.shape[1]
    cq, ck = weight.shape[1:]
    c = torch.zeros(B, Hq, N, N, dtype=F64)
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            s = scale * (q[b, h] @ k[b, kh].T)

            def s0(i, j):
                if not (0 <= i < N and 0 <= j < N) or (causal and j > i):
                    return 0.0
                return float(s[i, j])

            for i in range(N):
                for j in range(N):
                    c[b, h, i, j] = sum(weight[h, a, bb].item() * s0(i - (cq - 1) + a, j - (ck - 1) // 2 + bb)
                                        for a in range(cq) for bb in range(ck))
    if causal:
        c = c.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    return c


def conv_attention_by_double_sum(q, k, v, weight, causal, scale):
    c = conv_scores_by_double_sum(q, k, weight, causal, scale)
    Hq = q.shape[1]
    return torch.softmax(c, dim=-1) @ v.repeat_interleave(Hq // v.shape[1], dim=1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D", [
    (1, 1, 1, 1, 1, 16), (2, 4, 2, 7, 7, 8), (1, 3, 1, 5, 9, 12), (1, 2, 2, 9, 4, 8),
])
def test_naive_attention_matches_loops(B, Hq, Hkv, Nq, Nk, D, causal):
    q, k, v = rand_qkv(B, Hq, Hkv, Nq, Nk, D, dtype=F64, device="cpu")
    scale = 0.7
    ref = attention_by_loops(q, k, v, causal, scale)
    out = mta.naive_attention(q, k, v, causal=causal, scale=scale)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_naive_attention_lse_and_empty_rows():
    # Nq > Nk with causal bottom-right alignment: the first Nq - Nk queries see nothing.
    q, k, v = rand_qkv(1, 2, 1, 6, 3, 8, dtype=F64, device="cpu")
    o, lse = mta.naive_attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o[:, :, :3], torch.zeros_like(o[:, :, :3]))
    assert torch.isneginf(lse[:, :, :3]).all() and torch.isfinite(lse[:, :, 3:]).all()
    s = (q[:, :, 3:] @ k.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse[:, :, 3:], torch.logsumexp(s, -1))


def test_naive_attention_grad_finite_with_empty_rows():
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 1, 1, 5, 2, 4, device="cpu"))
    mta.naive_attention(q, k, v, causal=True).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert torch.equal(q.grad[0, 0, :3], torch.zeros(3, 4))


# One rounding of the output to each dtype (its unit roundoff), beside which fp32's own errors are small.
ROUNDING = {torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8, torch.float32: 1e-6}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_naive_attention_low_precision_dtype(dtype):
    """Low-precision inputs are computed in fp32, as documented: the output is the float64 result of the same
    (rounded) inputs, rounded once to ``dtype``. Computed in fp16 or bf16 it would be several roundings off."""
    q, k, v = rand_qkv(2, 2, 1, 33, 33, 16, dtype=dtype, device="cpu")
    out, lse = mta.naive_attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, ref_lse = mta.naive_attention(q.double(), k.double(), v.double(), causal=True, return_lse=True)
    torch.testing.assert_close(out.double(), ref, rtol=ROUNDING[dtype], atol=1e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("N,Hq,Hkv,cq,ck", [
    (1, 1, 1, 1, 1), (5, 2, 1, 3, 3), (4, 2, 2, 6, 11), (9, 4, 2, 2, 9), (7, 1, 1, 11, 15), (6, 2, 1, 3, 1),
])
def test_conv_reference_matches_double_sum(N, Hq, Hkv, cq, ck, causal):
    q, k, v = rand_qkv(2, Hq, Hkv, N, N, 8, dtype=F64, device="cpu")
    weight = rand(Hq, cq, ck, dtype=F64, device="cpu", scale=0.2)
    ref = conv_attention_by_double_sum(q, k, v, weight, causal, 0.5)
    out, lse = mta.conv_attention_reference(q, k, v, weight, causal=causal, scale=0.5, return_lse=True)
    torch.testing.assert_close(out, ref, rtol=1e-11, atol=1e-11)
    c = conv_scores_by_double_sum(q, k, weight, causal, 0.5)
    torch.testing.assert_close(lse, torch.logsumexp(c, dim=-1), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("cq,ck", [(1, 1), (3, 5), (6, 11)])
def test_identity_kernel_is_causal_attention(cq, ck):
    q, k, v = rand_qkv(2, 4, 2, 19, 19, 16, dtype=F64, device="cpu")
    weight = torch.zeros(4, cq, ck, dtype=F64)
    weight[:, cq - 1, (ck - 1) // 2] = 1.0
    out = mta.conv_attention_reference(q, k, v, weight, causal=True)
    torch.testing.assert_close(out, mta.naive_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_one_by_one_kernel_scales_scores_per_head(causal):
    q, k, v = rand_qkv(1, 3, 1, 11, 11, 8, dtype=F64, device="cpu")
    w = torch.tensor([0.5, -1.5, 2.0], dtype=F64)
    out = mta.conv_attention_reference(q, k, v, w[:, None, None], causal=causal)
    for h in range(3):
        ref = mta.naive_attention(q[:, h:h + 1], k, v, causal=causal, scale=w[h].item() * 8 ** -0.5)
        torch.testing.assert_close(out[:, h:h + 1], ref, rtol=1e-12, atol=1e-12)


def test_conv_reference_is_causal():
    N, t = 24, 13
    q, k, v = rand_qkv(1, 2, 1, N, N, 8, dtype=F64, device="cpu")
    weight = rand(2, 6, 11, dtype=F64, device="cpu", scale=0.3)
    before = mta.conv_attention_reference(q, k, v, weight)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, :, t] += 1.0
    k2[:, :, t] -= 2.0
    v2[:, :, t] *= 3.0
    after = mta.conv_attention_reference(q2, k2, v2, weight)
    torch.testing.assert_close(after[:, :, :t], before[:, :, :t], rtol=0, atol=0)
    assert (after[:, :, t] - before[:, :, t]).abs().max() > 1e-3  # the change is visible from t on


def test_conv_reference_mixed_dtypes_and_autograd():
    """fp16 activations with an fp32 weight: output and gradients in their inputs' dtypes, and the float64
    values (the double sum's output, autograd's gradients of the float64 reference) to fp16 accuracy."""
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 2, 1, 10, 10, 8, dtype=torch.float16, device="cpu"))
    weight = rand(2, 2, 3, device="cpu", scale=0.2).requires_grad_()
    out = mta.conv_attention_reference(q, k, v, weight)
    assert out.dtype == torch.float16
    out.float().square().sum().backward()
    xs64 = [t.detach().double().requires_grad_() for t in (q, k, v, weight)]
    ref = mta.conv_attention_reference(*xs64)
    torch.testing.assert_close(ref.detach(), conv_attention_by_double_sum(*(t.detach() for t in xs64), True, 8 ** -0.5),
                               rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=2 ** -11, atol=1e-6)
    ref.square().sum().backward()
    for name, t, t64 in zip(("q", "k", "v", "weight"), (q, k, v, weight), xs64):
        assert t.grad is not None and t.grad.dtype == t.dtype, name
        g, want = t.grad.double(), t64.grad
        assert (g - want).norm() <= 2e-3 * want.norm(), name


def test_conv_reference_gradcheck():
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 2, 1, 5, 5, 4, dtype=F64, device="cpu"))
    weight = rand(2, 2, 3, dtype=F64, device="cpu", scale=0.3).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: mta.conv_attention_reference(*a), (q, k, v, weight))


@pytest.mark.parametrize("B, N", [(0, 5), (2, 0)])
def test_conv_reference_empty_input_gives_the_weight_a_zero_gradient(B, N):
    """With no batch or no position the loss does not depend on the weight: its gradient is zeros (as
    ``conv_attention``'s), not None."""
    q, k, v = (torch.randn(B, 2, N, 4, dtype=F64, requires_grad=True) for _ in range(3))
    weight = torch.randn(2, 3, 5, dtype=F64, requires_grad=True)
    mta.conv_attention_reference(q, k, v, weight).sum().backward()
    assert weight.grad is not None and torch.equal(weight.grad, torch.zeros_like(weight))

"""The public API as issues #12 and #13 state it, checked against a float64 reference written here, independently
of ``mta.reference``, straight from ``docs/mta-semantics.md``: signatures, shapes and dtypes, explicit scales,
strided inputs and lengths, even ``cq``, ``ck = 1``, empty inputs, the decode ops under ``torch.compile``.

What the other test files already check (the kernel and length grids, poisoned caches, causality, the usual bad
inputs) is not repeated here.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import triton

import mta
from conftest import DEVICE, close_in_norm as close, rand, rand_qkv
from mta import ops

TOL = {torch.float32: 2e-5, torch.float16: 4e-3}
NAMES = ("dq", "dk", "dv", "dweight")


# --- an independent float64 reference ------------------------------------------------------------------------


def mta_forward(q, k, v, weight, causal=True, scale=None):
    """``(o, lse)`` in float64 on the CPU, from the semantics' steps 1-7: ``S0`` written into a grid padded with
    ``cq - 1`` zero rows on top and ``pk`` zero columns each side, then one shifted window per kernel tap
    (``C[i, j] += w[a, b] * S0p[i + a, j + b]``); differentiable."""
    q, k, v, weight = (x.double().cpu() for x in (q, k, v, weight))
    B, Hq, N, D = q.shape
    heads = torch.arange(Hq) // (Hq // k.shape[1])  # query head h reads kv head h // G
    cq, ck = weight.shape[1:]
    pk = (ck - 1) // 2
    scale = D ** -0.5 if scale is None else scale
    s = scale * q @ k[:, heads].transpose(-1, -2)
    future = torch.arange(N)[None, :] > torch.arange(N)[:, None]
    if causal:
        s = s.masked_fill(future, 0.0)
    padded = torch.zeros(B, Hq, N + cq - 1, N + 2 * pk, dtype=torch.float64)
    padded[:, :, cq - 1:, pk:pk + N] = s
    c = sum(weight[:, a, b, None, None] * padded[:, :, a:a + N, b:b + N] for a in range(cq) for b in range(ck))
    if causal:
        c = c.masked_fill(future, float("-inf"))
    return torch.softmax(c, -1) @ v[:, heads], torch.logsumexp(c, -1)


def mta_grads(q, k, v, weight, do, causal=True, scale=None):
    xs = [x.detach().double().cpu().requires_grad_() for x in (q, k, v, weight)]
    mta_forward(*xs, causal=causal, scale=scale)[0].backward(do.double().cpu())
    return [x.grad for x in xs]


def attention(q, k, v, scale=None):
    """Float64 causal attention, bottom-right aligned: query ``r`` of ``Nq`` sees keys ``0 .. Nk - Nq + r``."""
    q, k, v = (x.double().cpu() for x in (q, k, v))
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    heads = torch.arange(q.shape[1]) // (q.shape[1] // k.shape[1])
    s = (D ** -0.5 if scale is None else scale) * q @ k[:, heads].transpose(-1, -2)
    s = s.masked_fill(torch.arange(Nk)[None, :] > torch.arange(Nq)[:, None] + (Nk - Nq), float("-inf"))
    return torch.softmax(s, -1) @ v[:, heads]


def test_the_reference_here_is_the_documented_double_sum():
    """The windows above against the semantics' formula, index by index, on a tiny case."""
    q, k, v = rand_qkv(1, 2, 1, 5, 5, 4, dtype=torch.float64, device="cpu")
    w = rand(2, 3, 5, dtype=torch.float64, device="cpu")
    for causal in (True, False):
        o, _ = mta_forward(q, k, v, w, causal)
        s = 0.5 * q[0] @ k[0, [0, 0]].transpose(-1, -2)
        c = torch.zeros(2, 5, 5, dtype=torch.float64)
        for h, i, j, a, b in ((h, i, j, a, b) for h in range(2) for i in range(5) for j in range(5)
                              for a in range(3) for b in range(5)):
            r, col = i - 2 + a, j - 2 + b
            if 0 <= r < 5 and 0 <= col < 5 and not (causal and col > r):
                c[h, i, j] += w[h, a, b] * s[h, r, col]
        if causal:
            c = c.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(o[0], torch.softmax(c, -1) @ v[0, [0, 0]], rtol=1e-12, atol=1e-12)


# --- signatures ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [mta, ops], ids=["mta", "mta.ops"])
def test_signatures_are_the_issues(module):
    """Issue #13's signatures, keyword-only arguments and defaults included (and #12's conv_attention)."""
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    P, K, E = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty
    assert shape(module.decode_attention) == [("q", P, E), ("k_cache", P, E), ("v_cache", P, E),
                                              ("cache_seqlens", K, None), ("scale", K, None), ("num_splits", K, None)]
    assert shape(module.conv_decode_attention) == [
        ("q_cache", P, E), ("k_cache", P, E), ("v_cache", P, E), ("weight", P, E), ("cache_seqlens", K, None),
        ("num_queries", K, 1), ("scale", K, None), ("num_splits", K, None)]
    assert shape(module.conv_attention) == [("q", P, E), ("k", P, E), ("v", P, E), ("weight", P, E),
                                            ("causal", K, True), ("scale", K, None), ("return_lse", K, False)]
    assert shape(module.flash_attention)[3:] == [("causal", K, False), ("scale", K, None), ("return_lse", K, False)]
    for name in ("decode_attention", "conv_decode_attention", "conv_attention", "flash_attention",
                 "conv_attention_reference", "naive_attention", "MultiTokenAttention", "KVCache"):
        assert name in mta.__all__


# --- conv_attention: forward and backward against the reference here -------------------------------------------


# (B, Hq, Hkv, N, D, cq, ck, causal, dtype, scale): N = 1 with a kernel wider than the sequence, G = 3 query heads
# per kv head, head dims 1, 24 and 40, an even cq with ck = 1, an explicit scale.
FORWARD_CASES = [
    (1, 2, 1, 1, 16, 6, 11, False, torch.float32, None),
    (2, 3, 1, 3, 24, 4, 5, True, torch.float32, 0.37),
    (1, 2, 2, 13, 40, 2, 9, False, torch.float32, None),
    (1, 4, 2, 17, 24, 5, 3, True, torch.float16, None),
    (1, 2, 1, 40, 8, 8, 1, True, torch.float32, 1.5),
    (1, 2, 1, 20, 1, 2, 3, True, torch.float32, None),
]


@pytest.mark.parametrize("B,Hq,Hkv,N,D,cq,ck,causal,dtype,scale", FORWARD_CASES, ids=str)
def test_forward_and_lse(B, Hq, Hkv, N, D, cq, ck, causal, dtype, scale, poisoned_outputs):
    q, k, v = rand_qkv(B, Hq, Hkv, N, N, D, dtype=dtype)
    weight = rand(Hq, cq, ck, scale=0.2)
    o, lse = mta.conv_attention(q, k, v, weight, causal=causal, scale=scale, return_lse=True)
    ref_o, ref_lse = mta_forward(q, k, v, weight, causal, scale)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, Hq, N) and lse.dtype == torch.float32
    assert close(o, ref_o, TOL[dtype]) and close(lse, ref_lse, TOL[dtype])


def strided(x):
    """``x`` as a view into a wider buffer (one more head, five more columns; NaN around it): no unit row
    stride, an offset start."""
    buffer = torch.full((x.shape[0], x.shape[1] + 1, x.shape[2], x.shape[3] + 5), float("nan"), dtype=x.dtype,
                        device=x.device)
    buffer[:, 1:, :, 2:2 + x.shape[3]] = x
    return buffer[:, 1:, :, 2:2 + x.shape[3]]


# An explicit scale with G = 3, an even cq taller than N, a 2 x 9 kernel with ck = 9 > N, B = 3 for the weight
# gradient's batch sum, strided inputs (with a strided output gradient).
@pytest.mark.parametrize("B,Hq,Hkv,N,D,cq,ck,causal,scale,layout", [
    (2, 3, 1, 3, 24, 4, 5, True, 0.37, None),
    (1, 2, 2, 13, 40, 2, 9, False, None, None),
    (3, 2, 1, 10, 16, 2, 3, True, None, None),
    (2, 4, 2, 19, 24, 5, 3, True, None, "strided"),
], ids=str)
def test_gradients(B, Hq, Hkv, N, D, cq, ck, causal, scale, layout):
    q, k, v = rand_qkv(B, Hq, Hkv, N, N, D)
    weight, do = rand(Hq, cq, ck, scale=0.2), rand(B, Hq, N, D)
    view = strided if layout else (lambda x: x)
    xs = [view(x).requires_grad_() for x in (q, k, v)] + [weight.clone().requires_grad_()]
    mta.conv_attention(*xs, causal=causal, scale=scale).backward(view(do))
    for name, x, ref in zip(NAMES, xs, mta_grads(q, k, v, weight, do, causal, scale)):
        assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape, name
        assert close(x.grad, ref, TOL[torch.float32]), name


def test_sum_loss_and_shared_key_value_tensor():
    """``o.sum()`` hands the backward a stride-0 gradient; ``k`` and ``v`` one expanded tensor (stride 0 on the
    batch): its gradient is the sum of both, over the batch."""
    N, D = 11, 16
    q, x = rand(2, 2, N, D), rand(1, 1, N, D)
    weight = rand(2, 3, 5, scale=0.2)
    leaf = x.clone().requires_grad_()
    kv = leaf.expand(2, 1, N, D)
    mta.conv_attention(q, kv, kv, weight).sum().backward()
    _, dk, dv, _ = mta_grads(q, x.expand(2, 1, N, D), x.expand(2, 1, N, D), weight, torch.ones(2, 2, N, D))
    assert close(leaf.grad, (dk + dv).sum(0, keepdim=True), TOL[torch.float32])


@pytest.mark.parametrize("causal,dtype", [(False, torch.float32), (True, torch.float16)], ids=str)
def test_bitwise_deterministic_noncausal_and_half(causal, dtype):
    q, k, v = rand_qkv(2, 4, 2, 21, 21, 16, dtype=dtype)
    weight, do = rand(4, 3, 5, scale=0.2), rand(2, 4, 21, 16, dtype=dtype)
    runs = []
    for _ in range(2):
        xs = [x.clone().requires_grad_() for x in (q, k, v, weight)]
        mta.conv_attention(*xs, causal=causal).backward(do)
        runs.append([x.grad for x in xs])
    for name, a, b in zip(NAMES, *runs):
        assert torch.equal(a, b), name


# The causal mask goes on after the scaling (mta.conv_tiles.finish_scores): a -inf put in before it would turn
# into +inf for scale < 0 and NaN for scale = 0.
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_non_positive_scale(causal, scale):
    q, k, v = rand_qkv(1, 2, 1, 8, 8, 16)
    weight = rand(2, 2, 3, scale=0.2)
    out = mta.conv_attention(q, k, v, weight, causal=causal, scale=scale)
    assert close(out, mta_forward(q, k, v, weight, causal, scale)[0], TOL[torch.float32])


@pytest.mark.parametrize("shape", [(0, 4, 2, 8, 16), (2, 4, 2, 0, 16)], ids=["B=0", "N=0"])
def test_conv_attention_of_nothing_is_empty(shape):
    B, Hq, Hkv, N, D = shape
    q, k, v = rand_qkv(B, Hq, Hkv, N, N, D)
    assert mta.conv_attention(q, k, v, rand(Hq, 3, 5)).shape == (B, Hq, N, D)
    o, lse = mta.conv_attention_reference(q, k, v, rand(Hq, 3, 5), return_lse=True)  # as the fused kernel
    assert o.shape == (B, Hq, N, D) and lse.shape == (B, Hq, N)


# --- decode --------------------------------------------------------------------------------------------------


def poisoned(x, lengths):
    """``x`` with NaN at and past each sequence's length."""
    x = x.clone()
    for b, n in enumerate(lengths):
        x[b, :, n:] = float("nan")
    return x


def decode_reference(q, k, v, lengths, scale=None):
    return torch.cat([attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], scale)
                      for b, n in enumerate(lengths)])


def conv_decode_reference(q, k, v, weight, lengths, n, scale=None):
    return torch.cat([mta_forward(q[b:b + 1, :, :L], k[b:b + 1, :, :L], v[b:b + 1, :, :L], weight, True, scale)[0]
                      [:, :, L - n:] for b, L in enumerate(lengths)])


@pytest.mark.parametrize("lengths", [
    torch.tensor([7, 99, 13, 99], dtype=torch.int32)[::2],       # every other element
    torch.tensor([[7, 1], [13, 1]])[:, 0],                        # a column, int64
    (7, 13),                                                      # a tuple
], ids=["strided-int32", "column-int64", "tuple"])
def test_lengths_as_views_and_tuples(lengths):
    """Found reading lengths[1] at offset 1 of a strided view (the 99): fixed by making the lengths contiguous."""
    B, Hq, Hkv, n_max, D = 2, 4, 2, 20, 16
    k, v = (poisoned(rand(B, Hkv, n_max, D), [7, 13]) for _ in range(2))
    q_cache = poisoned(rand(B, Hq, n_max, D), [7, 13])
    q = torch.stack([q_cache[0, :, 5:7], q_cache[1, :, 11:13]])
    weight = rand(Hq, 3, 5, scale=0.2)
    out = mta.decode_attention(q, k, v, cache_seqlens=lengths)
    assert close(out, decode_reference(q, k, v, [7, 13]), TOL[torch.float32])
    out = mta.conv_decode_attention(q_cache, k, v, weight, cache_seqlens=lengths, num_queries=2)
    assert close(out, conv_decode_reference(q_cache, k, v, weight, [7, 13], 2), TOL[torch.float32])


# (B, Hq, Hkv, Nmax, D, nq, lengths, num_splits, dtype, scale, strided): 16 new queries (a sequence exactly that
# long), 5 splits for 50 keys, head dims 24 and 40, G = 2 and 3, fp16, explicit scales.
DECODE_CASES = [
    (2, 8, 2, 40, 24, 16, [16, 40], None, torch.float32, None, False),
    (3, 4, 2, 50, 40, 5, [5, 17, 50], 5, torch.float32, 0.7, True),
    (2, 6, 3, 64, 32, 7, [64, 9], 4, torch.float16, None, False),
    (1, 3, 1, 5, 8, 1, [5], None, torch.float32, -0.5, False),
]


@pytest.mark.parametrize("B,Hq,Hkv,n_max,D,nq,lengths,num_splits,dtype,scale,layout", DECODE_CASES, ids=str)
def test_decode(B, Hq, Hkv, n_max, D, nq, lengths, num_splits, dtype, scale, layout, poisoned_outputs):
    q = rand(B, Hq, nq, D, dtype=dtype)
    k, v = (poisoned(rand(B, Hkv, n_max, D, dtype=dtype), lengths) for _ in range(2))
    view = strided if layout else (lambda x: x)
    out = mta.decode_attention(view(q), view(k), view(v), cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                               scale=scale, num_splits=num_splits)
    assert out.shape == (B, Hq, nq, D) and out.dtype == dtype
    assert close(out, decode_reference(q, k, v, lengths, scale), TOL[dtype])


# (..., cq, ck): G = 8 and 16 new queries (128 rows), an even cq = 4 with ck = 1 and lengths under cq, an 8 x 13
# kernel on 5 positions, 1 x 7, explicit scales, strided caches.
CONV_DECODE_CASES = [
    (2, 8, 1, 24, 16, 16, [16, 24], None, torch.float32, None, False, 6, 11),
    (2, 6, 3, 30, 32, 7, [30, 9], 4, torch.float16, None, False, 4, 1),
    (2, 2, 1, 12, 16, 3, [3, 4], 2, torch.float32, 0.4, True, 1, 7),
    (1, 3, 1, 5, 8, 1, [5], None, torch.float32, -0.5, False, 8, 13),
    (2, 2, 2, 3, 24, 2, [2, 3], 3, torch.float32, None, False, 4, 3),
]


@pytest.mark.parametrize("B,Hq,Hkv,n_max,D,nq,lengths,num_splits,dtype,scale,layout,cq,ck", CONV_DECODE_CASES,
                         ids=str)
def test_conv_decode(B, Hq, Hkv, n_max, D, nq, lengths, num_splits, dtype, scale, layout, cq, ck,
                     poisoned_outputs):
    q, k, v = (poisoned(rand(B, h, n_max, D, dtype=dtype), lengths) for h in (Hq, Hkv, Hkv))
    weight = rand(Hq, cq, ck, scale=0.2)
    view = strided if layout else (lambda x: x)
    out = mta.conv_decode_attention(view(q), view(k), view(v), weight, cache_seqlens=lengths, num_queries=nq,
                                    scale=scale, num_splits=num_splits)
    assert out.shape == (B, Hq, nq, D) and out.dtype == dtype
    assert close(out, conv_decode_reference(q, k, v, weight, lengths, nq, scale), TOL[dtype])


def decode_call(B, Hq):
    q, k, v = rand(B, Hq, 2, 16), rand(B, 2, 20, 16), rand(B, 2, 20, 16)
    return lambda: mta.decode_attention(q, k, v)


def conv_decode_call(B, Hq, lengths=None):
    q, k, v = rand(B, Hq, 20, 16), rand(B, 2, 20, 16), rand(B, 2, 20, 16)
    return lambda: mta.conv_decode_attention(q, k, v, rand(Hq, 3, 5), cache_seqlens=lengths, num_queries=2)


# An empty batch or no query heads: an empty result, as flash_attention and conv_attention give (no launch, no
# division by a zero row count in the split or tile rules, no min() of an empty length tensor).
@pytest.mark.parametrize("call", [lambda: decode_call(0, 4), lambda: decode_call(2, 0), lambda: conv_decode_call(0, 4),
                                  lambda: conv_decode_call(2, 0), lambda: conv_decode_call(0, 4, [])],
                         ids=["decode-B=0", "decode-Hq=0", "conv-B=0", "conv-Hq=0", "conv-B=0-lengths"])
def test_empty_decode_is_empty(call):
    out = call()()
    assert out.numel() == 0 and out.shape[-1] == 16


def test_decode_bad_inputs_not_covered_elsewhere():
    q, k, v = rand(2, 4, 2, 16), rand(2, 2, 20, 16), rand(2, 2, 20, 16)
    qc, w = rand(2, 4, 20, 16), rand(4, 3, 5)
    for lengths, error, match in [(torch.tensor(5), ValueError, r"shape \(2,\)"),
                                  (torch.tensor([[5, 6]]), ValueError, r"shape \(2,\)"),
                                  (torch.tensor([True, True]), TypeError, "int32 or int64"),
                                  (torch.tensor([5, 6], dtype=torch.int16), TypeError, "int32 or int64"),
                                  (torch.tensor([5, 6], device="meta"), ValueError, "cache_seqlens is on meta"),
                                  ([-1, 5], ValueError, "under Nq"), ([], ValueError, r"shape \(2,\)")]:
        with pytest.raises(error, match=match):
            mta.decode_attention(q, k, v, cache_seqlens=lengths)
    with pytest.raises(ValueError, match="one device"):
        mta.decode_attention(q, k.to("meta"), v.to("meta"))
    with pytest.raises(TypeError, match="share a dtype"):
        mta.decode_attention(q, k, v.half())
    with pytest.raises(TypeError, match="positional argument"):
        mta.decode_attention(q, k, v, [5, 6])  # keyword-only
    for weight, error, match in [(rand(4, 3), ValueError, "3 dimensions"),
                                 (torch.ones(4, 3, 5, dtype=torch.int32, device=DEVICE), TypeError, "floating-point"),
                                 (torch.ones(4, 3, 5, device="meta"), ValueError, "weight is on"),
                                 (torch.ones(4, 0, 5, device=DEVICE), ValueError, "at least 1 x 1"),
                                 (torch.ones(4, 3, 35, device=DEVICE), ValueError, "not supported")]:
        with pytest.raises(error, match=match):
            mta.conv_decode_attention(qc, k, v, weight)
    with pytest.raises(TypeError, match="num_queries"):
        mta.conv_decode_attention(qc, k, v, w, num_queries=True)
    with pytest.raises(TypeError, match="num_splits must be an int"):
        mta.conv_decode_attention(qc, k, v, w, num_splits=True)
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        mta.conv_decode_attention(qc.double(), k.double(), v.double(), w)
    with pytest.raises(ValueError, match="at most 256"):
        mta.conv_decode_attention(rand(1, 4, 4, 264), rand(1, 2, 4, 264), rand(1, 2, 4, 264), w)


def test_huge_lengths_in_a_list_are_named():
    q, k, v = rand(1, 2, 1, 16), rand(1, 2, 4, 16), rand(1, 2, 4, 16)
    with pytest.raises(ValueError, match=f"length {2 ** 40} over the cache size"):
        mta.decode_attention(q, k, v, cache_seqlens=[2 ** 40])
    with pytest.raises(ValueError, match=f"length {-2 ** 70} under"):
        mta.decode_attention(q, k, v, cache_seqlens=[-2 ** 70])


def _everything(q, k, v, w, do, lens):
    """Outputs and gradients of every public kernel function on these inputs."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, w)]
    flash, flash_lse = mta.flash_attention(*leaves[:3], causal=True, return_lse=True)
    conv, conv_lse = mta.conv_attention(*leaves, return_lse=True)
    torch.autograd.backward([flash, conv], [do, do])
    return {"flash": flash, "flash lse": flash_lse, "conv": conv, "conv lse": conv_lse,
            **{f"d{name}": x.grad for name, x in zip(("q", "k", "v", "weight"), leaves)},
            "decode": mta.decode_attention(q[:, :, -2:], k, v, cache_seqlens=lens),
            "conv decode": mta.conv_decode_attention(q, k, v, w, cache_seqlens=lens, num_queries=2)}


def test_batches_over_the_grid_limit_run_in_chunks(monkeypatch):
    """Past :data:`mta.launch.MAX_GRID_AXIS_1` programs of batch x heads, the launchers run chunks of sequences:
    the same outputs and gradients (here with the limit lowered to 4: 3 sequences x 4 query heads run a sequence
    at a time, the decoders' 3 sequences x 2 kv heads two and one; decode picks its split count per chunk, the
    weight's gradient is summed per chunk)."""
    q, k, v = rand_qkv(3, 4, 2, 20, 20, 16)
    w, do = rand(4, 2, 3, scale=0.3), rand(3, 4, 20, 16)
    lens = torch.tensor([20, 7, 13], dtype=torch.int32)
    whole = _everything(q, k, v, w, do, lens)
    monkeypatch.setattr(mta.launch, "MAX_GRID_AXIS_1", 4)
    assert mta.launch.batch_chunks(3, 4) == [(0, 1), (1, 2), (2, 3)]
    assert mta.launch.batch_chunks(3, 2) == [(0, 2), (2, 3)] and mta.launch.batch_chunks(2, 2) is None
    decoder_chunks = []
    batch_chunks = mta.launch.batch_chunks

    def spy(batch, heads):
        decoder_chunks.append((batch, heads, batch_chunks(batch, heads)))
        return decoder_chunks[-1][2]
    monkeypatch.setattr(mta.decode, "batch_chunks", spy)
    chunked = _everything(q, k, v, w, do, lens)
    assert (3, 2, [(0, 2), (2, 3)]) in decoder_chunks, decoder_chunks  # the decoders did run in chunks
    for name, x in whole.items():
        torch.testing.assert_close(chunked[name], x, atol=1e-6, rtol=1e-6, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's grid limit: GPU only")
def test_more_batch_x_heads_than_a_grid_axis_takes_on_the_gpu():
    """65,552 programs of batch x heads (4097 x 16): over CUDA's 65,535, launched in chunks; each sequence's
    results equal those of a small batch holding it."""
    B, H = 4097, 16
    q, k, v = (torch.randn(B, H, 4, 16, device="cuda", dtype=torch.float16) for _ in range(3))
    w, do = 0.3 * torch.randn(H, 2, 3, device="cuda"), torch.randn(B, H, 4, 16, device="cuda", dtype=torch.float16)
    lens = torch.randint(2, 5, (B,), dtype=torch.int32)
    big = _everything(q, k, v, w, do, lens)
    for rows in (slice(0, 3), slice(B - 3, B)):
        small = _everything(q[rows], k[rows], v[rows], w, do[rows], lens[rows])
        for name, x in small.items():
            if name != "dweight":  # summed over the batch
                torch.testing.assert_close(big[name][rows], x, atol=2e-3, rtol=2e-3, msg=name)


@pytest.mark.parametrize("fn", ["flash", "conv"])
def test_a_second_derivative_raises(fn):
    """The kernels' backward is not itself differentiable: a gradient of a gradient raises instead of reading as
    zero (which would silently drop a gradient penalty)."""
    q, k, v = (rand(1, 1, 6, 16).requires_grad_() for _ in range(3))
    w = rand(1, 2, 3).requires_grad_()
    out = mta.flash_attention(q, k, v, causal=True) if fn == "flash" else mta.conv_attention(q, k, v, w)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.square().sum().backward()


@pytest.mark.parametrize("fn", ["flash", "conv"])
def test_a_gradient_penalty_raises_where_the_incoming_gradient_is_a_constant(fn):
    """The gradient of ``out.sum()`` reaching the backward is a constant (it does not require grad), so
    ``once_differentiable`` alone would return a ``dq`` that does not require grad, and a penalty on it would be
    dropped without a word. It raises; the gradients themselves are the ones a plain backward gives."""
    q, k, v = (rand(1, 2, 6, 16).requires_grad_() for _ in range(3))
    w = rand(2, 2, 3).requires_grad_()
    inputs = (q, k, v) if fn == "flash" else (q, k, v, w)

    def attention(*t):
        return mta.flash_attention(*t, causal=True) if fn == "flash" else mta.conv_attention(*t)

    grads = torch.autograd.grad(attention(*inputs).sum(), inputs, create_graph=True)
    assert all(g.requires_grad for g in grads)
    plain = torch.autograd.grad(attention(*inputs).sum(), inputs)
    for g, p in zip(grads, plain):
        assert torch.equal(g.detach(), p)
    grads[0].mul_(0.5)  # a gradient of the graph may be changed in place (e.g. clipped), as any other
    penalty = attention(*inputs).square().sum() + grads[0].square().sum()
    with pytest.raises(RuntimeError, match="differentiate twice"):
        penalty.backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offsets past 2**31 elements: GPU only (4 GiB buffer)")
@pytest.mark.parametrize("fn", ["flash", "conv"])
def test_inputs_whose_batches_lie_past_2_to_the_31_elements(fn):
    """A program's batch offset ``b * stride_b`` past 2**31 elements: computed in int64, so batch 1 of a view with
    a batch stride of 2**31 + 256 reads the right rows (in int32 it wrapped to an illegal address)."""
    stride_b = 2 ** 31 + 256
    buffer = torch.zeros(stride_b + 2 * 16 * 16, device="cuda", dtype=torch.float16)
    x = buffer.as_strided((2, 2, 16, 16), (stride_b, 16 * 16, 16, 1))  # [B, H, N, D], batch 1 past 2**31
    x.copy_(torch.randn(2, 2, 16, 16, device="cuda", dtype=torch.float16))
    w = 0.3 * torch.randn(2, 2, 3, device="cuda")
    leaves = [x.detach().requires_grad_() for _ in range(3)]
    dense = [x.detach().contiguous().requires_grad_() for _ in range(3)]

    def run(q, k, v):
        return mta.flash_attention(q, k, v, causal=True) if fn == "flash" else mta.conv_attention(q, k, v, w)
    do = torch.randn(2, 2, 16, 16, device="cuda", dtype=torch.float16)
    got = [run(*leaves), *torch.autograd.grad(run(*leaves), leaves, do)]
    want = [run(*dense), *torch.autograd.grad(run(*dense), dense, do)]
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=0, rtol=0)


# --- the decode ops under torch.compile -----------------------------------------------------------------------


@pytest.mark.parametrize("op,args", [
    ("decode_attention", lambda: (rand(2, 4, 2, 16), rand(2, 2, 20, 16), rand(2, 2, 20, 16),
                                  torch.tensor([5, 20], dtype=torch.int32, device=DEVICE), 0.25, None)),
    ("conv_decode_attention", lambda: (*rand_qkv(2, 4, 2, 20, 20, 16), rand(4, 3, 5), None, 2, 0.25, 3)),
])
def test_opcheck_decode(op, args):
    torch.library.opcheck(getattr(torch.ops.mta, op).default, args(),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_decode_ops_compile_fullgraph():
    q, k, v = rand(2, 4, 2, 16), rand(2, 2, 20, 16), rand(2, 2, 20, 16)
    q_cache, weight = rand(2, 4, 20, 16), rand(4, 3, 5, scale=0.2)

    def step(q, k, v, q_cache, weight):
        return (ops.decode_attention(q, k, v, cache_seqlens=[5, 20])
                + ops.conv_decode_attention(q_cache, k, v, weight, cache_seqlens=[5, 20], num_queries=2))

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v, q_cache, weight), step(q, k, v, q_cache, weight))


def test_num_splits_past_the_key_tiles_are_dropped():
    """A split count over the key tiles of Nmax only adds empty splits: it is cut there, so a huge count neither
    allocates a state per split nor changes a bit of the result."""
    q, k, v, qc, w = rand(2, 4, 1, 16), rand(2, 2, 40, 16), rand(2, 2, 40, 16), rand(2, 4, 40, 16), rand(4, 3, 5)
    lengths = [40, 23]
    tiles = triton.cdiv(40, mta.decode.decode_tile(16, torch.float32)[0])
    assert torch.equal(mta.decode_attention(q, k, v, cache_seqlens=lengths, num_splits=10 ** 9),
                       mta.decode_attention(q, k, v, cache_seqlens=lengths, num_splits=tiles))
    out = mta.conv_decode_attention(qc, k, v, w, cache_seqlens=lengths, num_splits=10 ** 9)
    assert close(out, mta.conv_decode_attention(qc, k, v, w, cache_seqlens=lengths, num_splits=1), 1e-5)


# --- the device of the inputs, not the current one ---------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_inputs_on_another_gpu_than_the_current_one():
    """Tensors on ``cuda:1`` while ``cuda:0`` is current: every public function runs on their GPU and gives exactly
    what it gives on ``cuda:0`` (Triton launches on the current device unless the launcher guards it)."""
    torch.cuda.set_device(0)
    q, k, v = rand_qkv(2, 4, 2, 70, 70, 64, dtype=torch.bfloat16, device="cuda:0")
    weight, do = rand(4, 3, 5, scale=0.2, device="cuda:0"), rand(2, 4, 70, 64, dtype=torch.bfloat16, device="cuda:0")
    lens = torch.tensor([30, 70], dtype=torch.int32)

    def everything(q, k, v, weight, do):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, weight)]
        flash = mta.flash_attention(*leaves[:3], causal=True)
        conv = mta.conv_attention(*leaves)
        torch.autograd.backward([flash, conv], [do, do])
        return [flash, conv, *(x.grad for x in leaves),
                mta.decode_attention(q[:, :, -2:], k, v, cache_seqlens=lens),
                mta.conv_decode_attention(q, k, v, weight, cache_seqlens=lens, num_queries=2)]

    on_0 = everything(q, k, v, weight, do)
    inputs_1 = [x.to("cuda:1") for x in (q, k, v, weight, do)]
    everything(*inputs_1)  # compiles for cuda:1 outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        on_1 = everything(*inputs_1)
        torch.cuda.synchronize("cuda:1")
    assert torch.cuda.current_device() == 0
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA and "_kernel" in e.name]
    assert kernels and {e.device_index for e in kernels} == {1}, {(e.name, e.device_index) for e in kernels}
    for a, b in zip(on_0, on_1):
        assert b.device == torch.device("cuda:1") and torch.equal(a, b.to("cuda:0"))

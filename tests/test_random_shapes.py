"""Every public kernel on random shapes against its float64 reference (GPU only: bf16, long caches, many compiles).

flash_attention (output, lse, dq/dk/dv; Nq != Nk, GQA, causal or not, any scale), conv_attention (output, lse and
the four gradients), decode_attention and conv_decode_attention (ragged lengths, caches poisoned with NaN past them,
forced split counts), in both storage layouts ([B, H, N, D] and the projections' [B, N, H, D]), fp32/fp16/bf16,
head dims 16-256 that are not all powers of two; and torch.compile of the custom ops. A case fails on any error,
any non-finite value, or a relative error past the dtype's tolerance. ``MTA_RANDOM_SHAPES`` cases per function
(default 12), drawn from the seed ``MTA_RANDOM_SEED``
(default fixed, so a run is repeatable; another seed draws other shapes); each case is its own pytest item, so
``pytest -n 14`` compiles them side by side.
"""
import os
import random

import pytest
import torch

import mta
from conftest import ON_GPU

pytestmark = pytest.mark.skipif(not ON_GPU, reason="random shapes run on a GPU (bf16, long caches)")

OUT_TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
#: MTA's lse in 16 bits: the folded keys are rounded to the input dtype (bf16: 1-2.4e-4 of |lse| measured). The
#: lse is a log-normalizer, so it is compared with an absolute floor of 1 a row (an error of 1e-3 there is 1e-3 of
#: every probability): where a score is about zero from cancelling terms, that rounding is not small beside it
#: (bf16, N = 1: an lse near -0.008 off by about 1e-4).
LSE_TOL = {torch.float32: 1e-4, torch.float16: 1e-4, torch.bfloat16: 1e-3}
GRAD_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEAD_DIMS = [16, 24, 40, 64, 72, 96, 128, 160, 200, 256]
CASES = int(os.environ.get("MTA_RANDOM_SHAPES", "12"))
DEV = mta.runtime.DEVICE
rng = random.Random(int(os.environ.get("MTA_RANDOM_SEED", "202611241")))


def off(a, b, tol, floor=1e-3):
    """How far past ``tol`` (relative Frobenius, with a floor for about-zero references: a gradient that is 0 in
    exact arithmetic, e.g. dk of a single key, is rounding noise in the kernel) ``a`` is: <= 1 ok."""
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / (tol * (b.norm() + floor * b.numel() ** 0.5))).item()


def layout(x, transposed):
    """``x`` [B, H, N, D] as it is, or as a view of [B, N, H, D] storage."""
    return x.transpose(1, 2).contiguous().transpose(1, 2) if transposed else x


def poison(x, lengths):
    for b, n in enumerate(lengths):
        x[b, :, n:] = float("nan")
    return x


def heads():
    group, hkv = rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 3])
    return group * hkv, hkv


FLASH = []
for _ in range(CASES):
    hq, hkv = heads()
    causal = rng.random() < 0.7
    nq = rng.randint(1, 400)
    nk = nq if rng.random() < 0.5 else rng.randint(1, 400)
    FLASH.append((rng.choice(DTYPES), rng.choice(HEAD_DIMS), nq, nk, hq, hkv, causal, rng.randint(1, 2),
                  rng.random() < 0.5, rng.choice([None, 0.05, 0.3])))


@pytest.mark.parametrize("dtype,D,Nq,Nk,Hq,Hkv,causal,B,transposed,scale", FLASH, ids=str)
def test_flash(dtype, D, Nq, Nk, Hq, Hkv, causal, B, transposed, scale):
    torch.manual_seed(Nq * 1000 + Nk + D)
    q = layout(torch.randn(B, Hq, Nq, D, device=DEV, dtype=dtype), transposed)
    k, v = (layout(torch.randn(B, Hkv, Nk, D, device=DEV, dtype=dtype), transposed) for _ in range(2))
    do = torch.randn(B, Hq, Nq, D, device=DEV, dtype=dtype)
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o, lse = mta.flash_attention(*xs, causal=causal, scale=scale, return_lse=True)
    o.backward(do)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ro, rlse = mta.naive_attention(*refs, causal=causal, scale=scale, return_lse=True)
    ro.backward(do.double())
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rlse))
    seen = torch.isfinite(rlse)
    errs = [off(o, ro, OUT_TOL[dtype]), off(lse[seen], rlse[seen], 1e-5)]
    errs += [off(x.grad, r.grad, GRAD_TOL[dtype], 1e-2) for x, r in zip(xs, refs)]
    assert all(e <= 1 for e in errs), errs


CONV = []
for _ in range(CASES):
    hq, hkv = heads()
    CONV.append((rng.choice(DTYPES), rng.choice(HEAD_DIMS), rng.randint(1, 16), rng.choice(range(1, 18, 2)),
                 rng.randint(1, 260), hq, hkv, rng.random() < 0.75, rng.randint(1, 2), rng.random() < 0.5,
                 rng.choice([None, 0.1])))


@pytest.mark.parametrize("dtype,D,cq,ck,N,Hq,Hkv,causal,B,transposed,scale", CONV, ids=str)
def test_conv(dtype, D, cq, ck, N, Hq, Hkv, causal, B, transposed, scale):
    torch.manual_seed(N * 1000 + D + cq)
    q = layout(torch.randn(B, Hq, N, D, device=DEV, dtype=dtype), transposed)
    k, v = (layout(torch.randn(B, Hkv, N, D, device=DEV, dtype=dtype), transposed) for _ in range(2))
    w = 0.2 * torch.randn(Hq, cq, ck, device=DEV)
    do = torch.randn(B, Hq, N, D, device=DEV, dtype=dtype)
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, w)]
    o, lse = mta.conv_attention(*xs, causal=causal, scale=scale, return_lse=True)
    o.backward(do)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v, w)]
    ro, rlse = mta.conv_attention_reference(*refs, causal=causal, scale=scale, return_lse=True)
    ro.backward(do.double())
    errs = [off(o, ro, OUT_TOL[dtype] * 2), off(lse, rlse, LSE_TOL[dtype], floor=1.0)]
    errs += [off(x.grad, r.grad, GRAD_TOL[dtype], 1e-2) for x, r in zip(xs, refs)]
    assert all(e <= 1 for e in errs), errs


DECODE = []
for _ in range(CASES):
    hq, hkv = heads()
    nq = rng.choice([1, 1, 2, 3, 5, 8, 16])
    n_max = rng.choice([nq, rng.randint(16, 300), rng.randint(300, 5000)])
    n_max = max(n_max, nq)
    B = rng.randint(1, 3)
    lengths = [rng.randint(nq, n_max) for _ in range(B)]
    DECODE.append((rng.choice(DTYPES), rng.choice(HEAD_DIMS), nq, n_max, tuple(lengths), hq, hkv,
                   rng.random() < 0.5, rng.choice([None, None, 1, 2, 7, 40]), rng.random() < 0.3))


@pytest.mark.parametrize("dtype,D,nq,n_max,lengths,Hq,Hkv,transposed,num_splits,device_lengths", DECODE, ids=str)
def test_decode(dtype, D, nq, n_max, lengths, Hq, Hkv, transposed, num_splits, device_lengths):
    torch.manual_seed(n_max + D + nq)
    B = len(lengths)
    q = layout(torch.randn(B, Hq, nq, D, device=DEV, dtype=dtype), transposed)
    k, v = (layout(poison(torch.randn(B, Hkv, n_max, D, device=DEV, dtype=dtype), lengths), transposed)
            for _ in range(2))
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEV if device_lengths else "cpu")
    o = mta.decode_attention(q, k, v, cache_seqlens=lens, num_splits=num_splits)
    ref = torch.cat([mta.naive_attention(q[b:b + 1].double(), k[b:b + 1, :, :n].double(), v[b:b + 1, :, :n].double(),
                                         causal=True) for b, n in enumerate(lengths)])
    assert o.shape == ref.shape and o.dtype == dtype
    assert off(o, ref, OUT_TOL[dtype]) <= 1


CONV_DECODE = []
for _ in range(CASES):
    hq, hkv = heads()
    nq = rng.choice([1, 1, 2, 3, 4, 7, 16])
    cq, ck = rng.choice([1, 2, 3, 6, 11, 16, 24, 32]), rng.choice([1, 3, 9, 11, 15, 25, 33])
    n_max = max(nq, rng.choice([rng.randint(1, 40), rng.randint(40, 400), rng.randint(400, 3000)]))
    B = rng.randint(1, 3)
    lengths = [rng.randint(nq, n_max) for _ in range(B)]
    CONV_DECODE.append((rng.choice(DTYPES), rng.choice(HEAD_DIMS[:8]), cq, ck, nq, n_max, tuple(lengths), hq, hkv,
                        rng.random() < 0.5, rng.choice([None, None, 1, 3, 16])))


@pytest.mark.parametrize("dtype,D,cq,ck,nq,n_max,lengths,Hq,Hkv,transposed,num_splits", CONV_DECODE, ids=str)
def test_conv_decode(dtype, D, cq, ck, nq, n_max, lengths, Hq, Hkv, transposed, num_splits):
    torch.manual_seed(n_max + D + nq + cq)
    B = len(lengths)
    q = layout(poison(torch.randn(B, Hq, n_max, D, device=DEV, dtype=dtype), lengths), transposed)
    k, v = (layout(poison(torch.randn(B, Hkv, n_max, D, device=DEV, dtype=dtype), lengths), transposed)
            for _ in range(2))
    w = 0.2 * torch.randn(Hq, cq, ck, device=DEV)
    o = mta.conv_decode_attention(q, k, v, w, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                  num_queries=nq, num_splits=num_splits)
    ref = torch.cat([mta.conv_attention_reference(*(x[b:b + 1, :, :n].double() for x in (q, k, v)),
                                                  w.double())[:, :, n - nq:] for b, n in enumerate(lengths)])
    assert o.shape == ref.shape and o.dtype == dtype
    assert off(o, ref, 2 * OUT_TOL[dtype]) <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("conv", [False, True])
def test_torch_compile(conv, dtype):
    torch.manual_seed(7)
    B, Hq, Hkv, N, D = 2, 4, 2, 77, 48
    q = torch.randn(B, Hq, N, D, device=DEV, dtype=dtype)
    k, v = (torch.randn(B, Hkv, N, D, device=DEV, dtype=dtype) for _ in range(2))
    w = 0.2 * torch.randn(Hq, 3, 5, device=DEV)
    do = torch.randn_like(q)

    def f(q, k, v, w):
        return mta.conv_attention(q, k, v, w, causal=True) if conv else mta.flash_attention(q, k, v, causal=True)

    grads = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v, w)]
        out = fn(*xs)
        out.backward(do)
        grads.append([out] + [x.grad for x in xs[:3 + conv]])
    for a, b in zip(*grads):
        assert torch.equal(a, b)

"""H100: random shapes against the float64 references, new seed (2026-11-25): mta.conv_attention forward +
backward (views with permuted strides too) and both decode functions (ragged lengths, caches poisoned with NaN past
each length, random split counts). One case per pytest item (``-n 14`` compiles side by side).

    PYTHONPATH=. python -m pytest -q -p no:cacheprovider notes/h100_2026-11-25f/fuzz_gpu.py -n 14
"""
import random

import pytest
import torch

import mta
from mta.reference import conv_attention_reference, naive_attention

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEAD_DIMS = [16, 24, 40, 64, 80, 96, 128, 160, 200, 256]
rng = random.Random(20261125)
CONV, DECODE = [], []
for _ in range(40):
    group, hkv = rng.choice([1, 2, 4]), rng.choice([1, 2])
    CONV.append((rng.choice(DTYPES), rng.choice(HEAD_DIMS), rng.randint(1, 24), rng.choice(range(1, 26, 2)),
                 rng.randint(1, 400), group * hkv, hkv, rng.random() < 0.75, rng.randint(1, 2), rng.random() < 0.3))
for _ in range(60):
    group, hkv = rng.choice([1, 2, 4, 8]), rng.choice([1, 2])
    mta_kernel = (rng.randint(1, 12), rng.choice(range(1, 16, 2))) if rng.random() < 0.5 else None
    DECODE.append((rng.choice(DTYPES), rng.choice(HEAD_DIMS), group * hkv, hkv, rng.randint(1, 3), rng.randint(1, 6),
                   rng.randint(1, 5000), rng.choice([None, None, 1, 3, 17, 64]), mta_kernel))


def off(a, b, tol):
    """How far past ``tol`` (relative, with a floor for values about 0) ``a`` is: <= 1 ok."""
    return ((a.double() - b).norm() / (tol * (b.norm() + 1e-2 * b.numel() ** 0.5))).item()


def maybe_permuted(x, permuted):
    """``x`` itself, or the same values as a ``[B, N, H, D]`` tensor's ``[B, H, N, D]`` view."""
    return x.transpose(1, 2).contiguous().transpose(1, 2) if permuted else x


@pytest.mark.parametrize("dtype,D,cq,ck,N,Hq,Hkv,causal,B,permuted", CONV, ids=str)
def test_conv_forward_backward(dtype, D, cq, ck, N, Hq, Hkv, causal, B, permuted):
    torch.manual_seed(N * 1000 + D + cq)
    q = torch.randn(B, Hq, N, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=dtype) for _ in range(2))
    w = 0.2 * torch.randn(Hq, cq, ck, device="cuda")
    do = torch.randn(B, Hq, N, D, device="cuda", dtype=dtype)
    xs = [maybe_permuted(x, permuted).requires_grad_() for x in (q, k, v)] + [w.clone().requires_grad_()]
    o = mta.conv_attention(*xs, causal=causal)
    o.backward(do)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v, w)]
    o_ref = conv_attention_reference(*refs, causal=causal)
    o_ref.backward(do.double())
    errs = [off(o, o_ref.detach(), TOL[dtype])] + [off(x.grad, r.grad, TOL[dtype]) for x, r in zip(xs, refs)]
    assert all(e <= 1 for e in errs), errs


@pytest.mark.parametrize("dtype,D,Hq,Hkv,B,nq,n_max,splits,mta_kernel", DECODE, ids=str)
def test_decode(dtype, D, Hq, Hkv, B, nq, n_max, splits, mta_kernel):
    torch.manual_seed(n_max + D)
    n_max = max(n_max, nq)
    lens = [n_max] + [random.Random(n_max + i).randint(nq, n_max) for i in range(1, B)]
    q_cache = torch.randn(B, Hq, n_max, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Hkv, n_max, D, device="cuda", dtype=dtype) for _ in range(2))
    for b, n in enumerate(lens):  # nothing past a length may be read
        for x in (q_cache, k, v):
            x[b, :, n:] = float("nan")
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if mta_kernel is None:
        q = torch.stack([q_cache[b, :, n - nq:n] for b, n in enumerate(lens)])
        out = mta.decode_attention(q, k, v, cache_seqlens=seqlens, num_splits=splits)
    else:
        w = 0.2 * torch.randn(Hq, *mta_kernel, device="cuda")
        out = mta.conv_decode_attention(q_cache, k, v, w, cache_seqlens=seqlens, num_queries=nq, num_splits=splits)
    assert out.shape == (B, Hq, nq, D)
    for b, n in enumerate(lens):
        kb, vb = k[b:b + 1, :, :n].double(), v[b:b + 1, :, :n].double()
        if mta_kernel is None:
            ref = naive_attention(q_cache[b:b + 1, :, n - nq:n].double(), kb, vb, causal=True)
        else:
            ref = conv_attention_reference(q_cache[b:b + 1, :, :n].double(), kb, vb, w.double(),
                                           causal=True)[:, :, n - nq:]
        assert off(out[b:b + 1], ref, TOL[dtype]) <= 1, (b, n)

"""H100: random shapes, a new seed, against float64 references: mta.conv_attention forward + backward, and
mta.decode_attention / mta.conv_decode_attention on ragged caches poisoned with NaN past each length. Inputs are
sometimes non-contiguous ([B, N, H, D] transposed). One case per pytest item, so ``-n 14`` compiles side by side.

    PYTHONPATH=. python -m pytest -q -p no:cacheprovider notes/h100_2026-11-25/fuzz_all.py -n 14
"""
import random

import pytest
import torch

import mta

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
rng = random.Random(20261125)
CONV, DECODE = [], []
for _ in range(40):
    CONV.append((rng.choice(DTYPES), rng.choice([16, 32, 48, 64, 72, 96, 128, 136, 192, 256]), rng.randint(1, 16),
                 rng.choice(range(1, 18, 2)), rng.randint(1, 260), rng.choice([1, 2, 3, 4]), rng.choice([1, 2]),
                 rng.random() < 0.75, rng.randint(1, 3), rng.random() < 0.5))
for _ in range(40):
    DECODE.append((rng.choice(DTYPES), rng.choice([16, 40, 64, 80, 96, 128, 160, 256]), rng.choice([1, 2, 4, 8]),
                   rng.choice([1, 2]), rng.randint(1, 16), rng.randint(1, 3), rng.choice([1, 600, 5000]),
                   rng.randint(1, 12), rng.choice(range(1, 16, 2)), rng.random() < 0.5,
                   rng.choice([None, 1, 3, 40])))


def off(a, b, tol):
    """How far past ``tol`` (relative, with a floor for values about 0) ``a`` is: <= 1 is within."""
    return ((a.double() - b).norm() / (tol * (b.norm() + 1e-2 * b.numel() ** 0.5))).item()


def rand(B, H, N, D, dtype, transposed, scale=1.0):
    x = torch.randn(B, N, H, D, device="cuda").transpose(1, 2) if transposed else torch.randn(B, H, N, D, device="cuda")
    return (x * scale).to(dtype)


@pytest.mark.parametrize("dtype,D,cq,ck,N,group,Hkv,causal,B,transposed", CONV, ids=str)
def test_conv_forward_backward(dtype, D, cq, ck, N, group, Hkv, causal, B, transposed):
    torch.manual_seed(N * 7 + D)
    Hq = group * Hkv
    q, k, v = (rand(B, h, N, D, dtype, transposed) for h in (Hq, Hkv, Hkv))
    w = 0.3 * torch.randn(Hq, cq, ck, device="cuda")
    do = torch.randn(B, Hq, N, D, device="cuda", dtype=dtype)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, w)]
    o = mta.conv_attention(*leaves, causal=causal)
    got = [o, *torch.autograd.grad(o, leaves, do)]
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, w)]
    r = mta.conv_attention_reference(*ref_leaves, causal=causal)
    want = [r, *torch.autograd.grad(r, ref_leaves, do.double())]
    for name, a, b in zip(("o", "dq", "dk", "dv", "dw"), got, want):
        assert torch.isfinite(a).all(), name
        assert off(a, b, TOL[dtype]) <= 1, (name, off(a, b, TOL[dtype]))


def decode_reference(q, k, v, lengths, scale):
    """Per sequence: queries at positions L - Nq .. L - 1 against keys 0 .. L - 1, causal, float64."""
    B, Hq, Nq, D = q.shape
    group = Hq // k.shape[1]
    out = []
    for b, L in enumerate(lengths):
        kb, vb = (t[b, :, :L].double().repeat_interleave(group, 0) for t in (k, v))
        s = torch.einsum("hqd,hkd->hqk", q[b].double(), kb) * scale
        pos = torch.arange(L - Nq, L, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(L, device=q.device)[None, :] > pos, float("-inf"))
        out.append(torch.einsum("hqk,hkd->hqd", s.softmax(-1), vb))
    return torch.stack(out)


@pytest.mark.parametrize("dtype,D,group,Hkv,Nq,B,n_max,cq,ck,transposed,num_splits", DECODE, ids=str)
def test_decode_and_conv_decode(dtype, D, group, Hkv, Nq, B, n_max, cq, ck, transposed, num_splits):
    torch.manual_seed(n_max + D + Nq)
    n_max = max(n_max, Nq)
    Hq = group * Hkv
    lengths = torch.randint(Nq, n_max + 1, (B,)).tolist()
    lengths[0] = n_max
    q_cache, k, v = (rand(B, h, n_max, D, dtype, transposed) for h in (Hq, Hkv, Hkv))
    for b, L in enumerate(lengths):  # what a kernel must never read
        for t in (q_cache, k, v):
            t[b, :, L:] = float("nan")
    q = torch.stack([q_cache[b, :, L - Nq:L] for b, L in enumerate(lengths)])
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    got = mta.decode_attention(q, k, v, cache_seqlens=seqlens, num_splits=num_splits)
    assert off(got, decode_reference(q, k, v, lengths, scale), TOL[dtype]) <= 1
    w = 0.3 * torch.randn(Hq, cq, ck, device="cuda")
    got = mta.conv_decode_attention(q_cache, k, v, w, cache_seqlens=seqlens, num_queries=Nq, num_splits=num_splits)
    for b, L in enumerate(lengths):
        want = mta.conv_attention_reference(*(t[b:b + 1, :, :L].double() for t in (q_cache, k, v)), w.double())
        assert off(got[b:b + 1], want[:, :, L - Nq:], TOL[dtype]) <= 1, b

"""H100: mta.conv_attention forward + backward on random shapes (dtype, head dim 16-256, kernel up to 32 x 33, N 1-300,
GQA, causal or not) against the float64 reference: any launch that fails or any gradient off. One case per pytest
item, so ``-n 14`` compiles side by side.

    PYTHONPATH=. python -m pytest -q -p no:cacheprovider notes/h100_remeasure_2026-11-24/fuzz_conv.py -n 14
"""
import random

import pytest
import torch

import mta

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
rng = random.Random(20261124)
CASES = []
for _ in range(48):
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    D = rng.choice([16, 24, 40, 64, 80, 96, 128, 160, 200, 256])
    cq, ck = rng.randint(1, 32), rng.choice(range(1, 34, 2))
    group, hkv = rng.choice([1, 2, 4]), rng.choice([1, 2])
    CASES.append((dtype, D, cq, ck, rng.randint(1, 300), group * hkv, hkv, rng.random() < 0.75, rng.randint(1, 2)))


def off(a, b, tol):
    """How far past ``tol`` (relative, with a floor for gradients that are about 0, e.g. N = 1) ``a`` is: <= 1 ok."""
    return ((a.double() - b).norm() / (tol * (b.norm() + 1e-2 * b.numel() ** 0.5))).item()


@pytest.mark.parametrize("dtype,D,cq,ck,N,Hq,Hkv,causal,B", CASES, ids=str)
def test_random_shape(dtype, D, cq, ck, N, Hq, Hkv, causal, B):
    torch.manual_seed(N * 1000 + D)
    q = torch.randn(B, Hq, N, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=dtype) for _ in range(2))
    w = 0.2 * torch.randn(Hq, cq, ck, device="cuda")
    do = torch.randn(B, Hq, N, D, device="cuda", dtype=dtype)
    xs = [x.clone().requires_grad_() for x in (q, k, v, w)]
    mta.conv_attention(*xs, causal=causal).backward(do)
    refs = [x.double().requires_grad_() for x in (q, k, v, w)]
    mta.conv_attention_reference(*refs, causal=causal).backward(do.double())
    errs = [off(x.grad, r.grad, TOL[dtype]) for x, r in zip(xs, refs)]
    assert all(e <= 1 for e in errs), errs

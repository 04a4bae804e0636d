"""The largest kernel the MTA functions take (``cq = 32``, ``ck = 33``) at the narrowest and widest head dims, every
dtype: forward, backward (fused, or in row chunks where the fused one does not fit) and decode against the float64
reference. On a GPU these are the tiles and shared-memory budgets at their limits; on the CPU one small case."""

from __future__ import annotations

import pytest
import torch

import mta
from conftest import ON_GPU, close_in_norm, rand, rand_qkv
from test_conv_backward import NAMES, TOL, check, grads, reference_grads
from test_conv_decode import run_case as run_decode_case

CQ, CK = mta.conv_forward.MAX_CQ, mta.conv_forward.MAX_CK
CASES = [(torch.float32, 16)] + ([(torch.float32, 256), (torch.bfloat16, 256), (torch.float16, 64),
                                  (torch.bfloat16, 96)] if ON_GPU else [])


@pytest.mark.parametrize("dtype,D,causal", [(*case, True) for case in CASES]
                         + [(*case, False) for case in CASES if ON_GPU], ids=str)
def test_forward_and_backward(dtype, D, causal):
    N = 45  # longer than cq and ck, not a multiple of any tile
    q, k, v = rand_qkv(1, 2, 1, N, N, D, dtype=dtype)
    weight, do = rand(2, CQ, CK, scale=0.1), rand(1, 2, N, D, dtype=dtype)
    out = mta.conv_attention(q, k, v, weight, causal=causal)
    ref = mta.conv_attention_reference(*(x.double() for x in (q, k, v, weight)), causal=causal)
    assert close_in_norm(out, ref, TOL[dtype])
    for name, x, y in zip(NAMES, grads(mta.conv_attention, q, k, v, weight, do, causal=causal),
                          reference_grads(q, k, v, weight, do, causal)):
        check(name, x, y, TOL[dtype])


@pytest.mark.parametrize("dtype,D", CASES, ids=str)
def test_decode(dtype, D):
    run_decode_case(CQ, CK, 2, dtype, Hq=2, Hkv=1, D=D, lengths=(1, 40, 75))

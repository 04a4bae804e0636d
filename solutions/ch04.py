"""Reference solutions to chapter 04's exercises (the MTA forward). Try the exercises first.

Checked by ``tests/test_exercises_04.py`` with the checkers in :mod:`mta.course.exercises.ch04`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU, before Triton is imported)
import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from mta.course.exercises.ch04 import DIAGONAL, FOLDED, SKIPPED


# Exercise 1: the diagonals, straight from the definition.
def diagonal_scores(q, k, w, scale):
    """``out[i, delta] = C[i, i - delta]``, ``0 <= delta < E``: each a sum of ``w[a, b] * S0[...]`` over the kernel,
    read from the pre-masked, zero-padded scores (0 where the key ``i - delta`` does not exist)."""
    N = q.shape[0]
    cq, ck = w.shape
    pk = (ck - 1) // 2
    E = cq - 1 + pk
    S0 = (scale * q @ k.T).tril()                                   # the future zeroed before the convolution
    S0_pad = F.pad(S0, (pk, pk, cq - 1, 0))                          # cq - 1 zero rows above, pk zero keys each side
    out = torch.zeros(N, E, dtype=q.dtype)
    for i in range(N):
        for delta in range(min(E, i + 1)):
            j = i - delta
            out[i, delta] = (w * S0_pad[i:i + cq, j:j + ck]).sum()   # padded rows i.., padded keys j..
    return out


# Exercise 2: a tile's kind from the definitions, by looking at its entries.
def reach(cq, ck):
    return cq - 1 + (ck - 1) // 2


def classify_by_definition(i0, j0, BM, BN, N, cq, ck):
    i = np.arange(i0, i0 + BM)[:, None]
    j = np.arange(j0, j0 + BN)[None, :]
    real = (i < N) & (j < N)
    if (j > i)[real].all():
        return SKIPPED                      # every real entry is in the future
    if (i - j >= reach(cq, ck)).all():
        return FOLDED                       # no mask of either kind can touch the full rectangle
    return DIAGONAL


# Exercise 3: the fold pre-pass, one program per BLOCK_N keys.
@triton.jit
def fold_kernel(K, W, KF, n, CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    PK: tl.constexpr = (CK - 1) // 2
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for a in tl.static_range(CQ):
        acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        for b in tl.static_range(CK):
            rows = offs_n - PK + b                                   # key j - pk + b; zero outside [0, n)
            k = tl.load(K + rows[:, None] * D + offs_d[None, :], mask=((rows >= 0) & (rows < n))[:, None], other=0.0)
            acc += tl.load(W + a * CK + b) * k
        tl.store(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], acc, mask=(offs_n < n)[:, None])


def fold_keys(k, w, block_n=16):
    N, D = k.shape
    cq, ck = w.shape
    kf = torch.empty(cq, N, D, device=k.device, dtype=torch.float32)
    fold_kernel[(triton.cdiv(N, block_n),)](k.contiguous(), w.contiguous(), kf, N, CQ=cq, CK=ck, D=D, BLOCK_N=block_n)
    return kf


# Exercise 4: the folded-key forward, non-causal, one program per BLOCK_M query rows.
LOG2E = 1.4426950408889634


@triton.jit
def folded_forward_kernel(Q, KF, V, O, LSE, n, qk_scale,
                          CQ: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)             # running max (base-2 units)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)                           # running sum of 2^(c - m)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)                      # running sum of 2^(c - m) v
    for start_n in range(0, n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n
        c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for a in tl.static_range(CQ):                                   # C = sum_a Q^(a) Kf_a^T
            rows = offs_m - (CQ - 1) + a                                # query i - (cq-1) + a, zero above row 0
            q_a = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=((rows >= 0) & (rows < n))[:, None],
                          other=0.0)
            kf_a = tl.load(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            c = tl.dot(q_a, tl.trans(kf_a), c, input_precision="ieee")
        c = tl.where(key_ok[None, :], c * qk_scale, float("-inf"))      # keys past the end weigh nothing
        m_new = tl.maximum(m, tl.max(c, 1))                             # finite: every tile has a real key
        p = tl.exp2(c - m_new[:, None])
        alpha = tl.exp2(m - m_new)                                      # rescales what came before
        v = tl.load(V + offs_n[:, None] * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    row_ok = offs_m < n
    tl.store(O + offs_m[:, None] * D + offs_d[None, :], acc / l[:, None], mask=row_ok[:, None])
    tl.store(LSE + offs_m, (m + tl.log2(l)) / 1.4426950408889634, mask=row_ok)


def folded_forward(q, kf, v, scale, block=16):
    N, D = q.shape
    o = torch.empty(N, D, device=q.device, dtype=torch.float32)
    lse = torch.empty(N, device=q.device, dtype=torch.float32)
    folded_forward_kernel[(triton.cdiv(N, block),)](q.contiguous(), kf.contiguous(), v.contiguous(), o, lse, N,
                                                    scale * LOG2E, CQ=kf.shape[0], D=D, BLOCK_M=block,
                                                    BLOCK_N=block)
    return o, lse

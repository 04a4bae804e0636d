"""Reference solutions to chapter 05's exercises (the MTA backward). Try the exercises first.

Checked by ``tests/test_exercises_05.py`` with the checkers in :mod:`mta.course.exercises.ch05`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU, before Triton is imported)
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from mta.reference import causal_future


# Exercise 1: the gradient of the scores.
def scores_grad(dC, weight, causal):
    """``dS`` from ``dC [B, Hq, N, N]``: the transposed convolution, then the pre-convolution zero."""
    N = dC.shape[-1]
    cq, ck = weight.shape[1:]
    pk = (ck - 1) // 2
    # The transpose of "pad cq - 1 rows on top, pk keys each side, correlate with w" is "pad cq - 1 rows at the
    # bottom, pk keys each side, correlate with w flipped on both axes".
    dS0 = F.conv2d(F.pad(dC, (pk, pk, 0, cq - 1)), weight.flip(1, 2)[:, None], groups=weight.shape[0])
    if causal:
        dS0 = dS0.masked_fill(causal_future(N, N, dC.device), 0.0)   # those scores were replaced by a constant
    return dS0


# Exercise 2: the kernel's gradient.
def kernel_grad(dC, S0, cq, ck):
    """``dweight[h, a, b] = sum over batch, i, j of dC[i, j] * S0p[i + a, j + b]``, ``S0p`` padded as in the
    forward (``cq - 1`` zero rows on top, ``pk`` zero keys each side)."""
    N = dC.shape[-1]
    pk = (ck - 1) // 2
    s0p = F.pad(S0, (pk, pk, cq - 1, 0))
    dw = torch.empty(dC.shape[1], cq, ck, dtype=dC.dtype)
    for a in range(cq):
        for b in range(ck):
            dw[:, a, b] = (dC * s0p[..., a:a + N, b:b + N]).sum(dim=(0, 2, 3))
    return dw


# Exercise 3: the far part's kernel-gradient partials, one program per (row tile, batch x query head).
@triton.jit
def dw_partials_kernel(U, K, OUT, n, num_heads, group_size,
                       CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr):
    PK: tl.constexpr = (CK - 1) // 2
    tile = tl.program_id(0)
    bh = tl.program_id(1)                                   # b * num_heads + h
    b = bh // num_heads
    kv_bh = b * (num_heads // group_size) + (bh % num_heads) // group_size
    offs_c = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, D)
    k = tl.load(K + kv_bh * n * D + offs_c[:, None] * D + offs_d[None, :], mask=(offs_c < n)[:, None], other=0.0)
    out = OUT + (tile * tl.num_programs(1) + bh) * CQ * CK
    for a in tl.static_range(CQ):
        for t in tl.static_range(CK):
            rows = offs_c + PK - t                              # u row paired with key c for kernel column t
            u = tl.load(U + ((bh * CQ + a) * n + rows[:, None]) * D + offs_d[None, :],
                        mask=((rows >= 0) & (rows < n))[:, None], other=0.0)
            tl.store(out + a * CK + t, tl.sum(tl.sum(u * k, 1), 0))


def dw_partials(u, k, ck, block_r):
    """``[cdiv(N, block_r), B, Hq, cq, ck]`` fp32 partials of the far part's kernel gradient (over ``scale``)."""
    B, Hq, cq, N, D = u.shape
    Hkv = k.shape[1]
    tiles = triton.cdiv(N, block_r)
    out = torch.empty(tiles, B, Hq, cq, ck, device=u.device, dtype=torch.float32)
    dw_partials_kernel[(tiles, B * Hq)](u.contiguous(), k.contiguous(), out, N, Hq, Hq // Hkv,
                                        CQ=cq, CK=ck, D=D, BLOCK_R=block_r)
    return out


# Exercise 4: dq's far part from the stored dC_far, one program per (row tile, batch x query head).
@triton.jit
def dq_far_kernel(DC, KF, DQ, n, scale, CQ: tl.constexpr, D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)          # the dq rows this program owns
    offs_d = tl.arange(0, D)
    DC += bh * n * n
    KF += bh * CQ * n * D
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, n, BLOCK_N):                                  # walk the keys
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n
        for a in tl.static_range(CQ):
            rows = offs_m + (CQ - 1) - a                                  # q_r sits in row r + cq-1-a of Q^(a)
            dc = tl.load(DC + rows[:, None] * n + offs_n[None, :],
                         mask=(rows < n)[:, None] & key_ok[None, :], other=0.0)
            kf = tl.load(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            acc = tl.dot(dc, kf, acc, input_precision="ieee")            # += dC_far[shifted rows] Kf_a
    tl.store(DQ + bh * n * D + offs_m[:, None] * D + offs_d[None, :], acc * scale, mask=(offs_m < n)[:, None])


def dq_far(dc_far, kf, scale, block=16):
    """``[B, Hq, N, D]`` fp32: the far part of dq, ``Gq`` never written."""
    B, Hq, cq, N, D = kf.shape
    dq = torch.empty(B, Hq, N, D, device=kf.device, dtype=torch.float32)
    dq_far_kernel[(triton.cdiv(N, block), B * Hq)](dc_far.contiguous(), kf.contiguous(), dq, N, scale,
                                                  CQ=cq, D=D, BLOCK_M=block, BLOCK_N=block)
    return dq


# Exercise 5: the teaching dV kernel, one program per (key tile, batch x kv head); it walks the query tiles of each
# query head of its group, so that its dV rows have one writer and the group's sum a fixed order.
@triton.jit
def dv_kernel(Q, KF, CD, DO, LSE, DV, n, scale, group_size,
              CQ: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, CAUSAL: tl.constexpr,
              D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)          # the keys this program owns
    kv_bh = tl.program_id(1)                                              # b * Hkv + h_kv
    offs_d = tl.arange(0, D)
    key_ok = offs_n < n
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for g in range(group_size):                                           # the query heads h_kv * G + g
        bh = kv_bh * group_size + g                                       # b * Hq + h in contiguous [B, Hq, ...]
        for start_m in range(0, n, BLOCK_M):                              # walk down the query tiles
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < n
            c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for a in tl.static_range(CQ):                                 # C / scale = sum_a Q^(a) Kf_a^T
                rows = offs_m - (CQ - 1) + a                              # shifted query rows (zero above row 0)
                q_a = tl.load(Q + (bh * n + rows[:, None]) * D + offs_d[None, :],
                              mask=((rows >= 0) & row_ok)[:, None], other=0.0).to(tl.float32)
                kf_a = tl.load(KF + ((bh * CQ + a) * n + offs_n[:, None]) * D + offs_d[None, :],
                               mask=key_ok[:, None], other=0.0).to(tl.float32)
                c += tl.dot(q_a, tl.trans(kf_a), input_precision="ieee")   # true fp32 products (not tf32)
            if CAUSAL:
                delta = offs_m[:, None] - offs_n[None, :]                 # i - j
                near = (delta >= 0) & (delta < E)
                cd = tl.load(CD + (bh * n + offs_m[:, None]) * E_PAD + delta, mask=near & row_ok[:, None],
                             other=0.0)
                c = tl.where(near, cd, c)                                 # put in the E diagonals
                c = tl.where(delta >= 0, c, float("-inf"))                # the mask after the convolution
            c = tl.where(key_ok[None, :], c, float("-inf"))               # keys past the end
            lse = tl.load(LSE + bh * n + offs_m, mask=row_ok, other=float("inf"))   # rows past the end: P = 0
            p = tl.exp(scale * c - lse[:, None])                          # P from the saved log-sum-exp
            do = tl.load(DO + (bh * n + offs_m[:, None]) * D + offs_d[None, :], mask=row_ok[:, None],
                         other=0.0).to(tl.float32)
            dv += tl.dot(tl.trans(p), do, input_precision="ieee")        # dV_J += P_IJ^T dO_I
    tl.store(DV + (kv_bh * n + offs_n[:, None]) * D + offs_d[None, :], dv, mask=key_ok[:, None])


def teaching_dv(q, kf, cd, do, lse, E, num_kv_heads, causal):
    """``dV [B, Hkv, N, D]`` fp32 of MTA: ``q, do [B, Hq, N, D]``, ``kf [B, Hq, cq, N, D]`` (fp32 or fp16), ``cd``
    ``[B, Hq, N, E_pad]`` and ``lse [B, Hq, N]`` fp32."""
    B, Hq, N, D = q.shape
    cq = kf.shape[2]
    dv = torch.empty(B, num_kv_heads, N, D, device=q.device, dtype=torch.float32)
    block = 16
    dv_kernel[(triton.cdiv(N, block), B * num_kv_heads)](
        q.contiguous(), kf.contiguous(), cd.contiguous(), do.contiguous(), lse.contiguous(), dv, N, D ** -0.5,
        Hq // num_kv_heads, CQ=cq, E=E, E_PAD=cd.shape[-1], CAUSAL=causal, D=D, BLOCK_M=block, BLOCK_N=block)
    return dv

"""FlashAttention-2 forward in Triton: one program per (query tile, batch x head).

The program keeps, for its ``BLOCK_M`` query rows, the online-softmax state of
chapter 02 — running max ``m``, normalizer ``l`` and unnormalized output
``acc`` — and walks the key tiles. Scores are kept in base-2 units
(``s * scale * log2(e)``) so that ``exp2`` replaces ``exp``.

Causal attention splits the walk in two stages: key tiles left of the
diagonal, which every row of the tile may see (no mask, the common case), and
the few tiles on the diagonal, which are masked. Key tiles right of the
diagonal are never loaded.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel_parts import LOG2E, finish_rows, key_tile_bounds, online_softmax_step, program_coordinates
from .launch import NO_SPECIALIZE


@triton.jit
def _attend_key_tiles(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                      offs_m, offs_d, start, stop, n_k, diag, qk_scale,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles ``[start, stop)`` into the state ``(acc, m, l)`` of the query tile.

    ``MASKED`` tiles may cross the end of the keys or (``CAUSAL``) the
    diagonal ``j <= i + diag``; the others are loaded and used whole.
    """
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    for start_n in range(start, stop, BLOCK_N):
        offs_k = start_n + offs_n
        kt_ptrs = k_base + offs_k[None, :] * stride_kn + offs_d[:, None] * stride_kd  # K^T tile [BLOCK_D, BLOCK_N]
        v_ptrs = v_base + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd  # V tile [BLOCK_N, BLOCK_D]
        if MASKED:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None] & (offs_k[None, :] < n_k), other=0.0)
            v = tl.load(v_ptrs, mask=(offs_k[:, None] < n_k) & d_ok[None, :], other=0.0)
        elif BLOCK_D != D:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], base-2 units
        if MASKED:
            keep = offs_k[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_m[:, None] + diag)
            s = tl.where(keep, s, float("-inf"))
        acc, m, l = online_softmax_step(acc, m, l, s, v, MASKED, PRECISION)
    return acc, m, l


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def flash_forward_kernel(Q, K, V, O, LSE,
                         stride_qb, stride_qh, stride_qm, stride_qd,
                         stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd,
                         stride_ob, stride_oh, stride_om, stride_od,
                         n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                         CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                         PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``O = softmax(scale * Q K^T) V`` and ``LSE`` (natural log, fp32, ``[B * Hq, n_q]``).

    Grid: ``(cdiv(n_q, BLOCK_M), B * Hq)``, heaviest (last) query tiles first (:mod:`mta.launch_order`).
    Query head ``h`` reads kv head ``h // group_size``. ``N_BUCKET`` is the autotuner's key only.
    """
    pid_m, pid_bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=True)
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    d_ok = offs_d < D

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E

    diag = n_k - n_q  # query i sees keys j <= i + diag (bottom-right alignment when n_q != n_k)
    full_stop, masked_stop = key_tile_bounds(m0, n_k, diag, 0, CAUSAL, BLOCK_M, BLOCK_N)
    acc, m, l = _attend_key_tiles(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  offs_m, offs_d, 0, full_stop, n_k, diag, qk_scale,
                                  False, CAUSAL, D, BLOCK_N, BLOCK_D, PRECISION)
    acc, m, l = _attend_key_tiles(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  offs_m, offs_d, full_stop, masked_stop, n_k, diag, qk_scale,
                                  True, CAUSAL, D, BLOCK_N, BLOCK_D, PRECISION)

    o, lse = finish_rows(acc, m, l)  # a query that saw no key (causal, n_q > n_k): o = 0, lse = -inf
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * n_q + offs_m, lse, mask=row_ok)

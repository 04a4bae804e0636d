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

from . import tuning
from .launch_order import heaviest_first


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
        elif BLOCK_D != D:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], base-2 units
        if MASKED:
            keep = offs_k[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_m[:, None] + diag)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        if MASKED:
            # A row that has seen only masked keys keeps m = -inf; subtract 0 instead (exp2(-inf) = 0).
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new_safe = m_new
        p = tl.math.exp2(s - m_new_safe[:, None])
        alpha = tl.math.exp2(m - m_new_safe)  # rescales what was accumulated under the old max
        l = l * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=(offs_k[:, None] < n_k) & d_ok[None, :], other=0.0)
        elif BLOCK_D != D:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return acc, m, l


@triton.autotune(configs=tuning.forward_configs(), key=["N_BUCKET", "BLOCK_D", "CAUSAL"],
                 prune_configs_by={"early_config_prune": tuning.prune_forward})
@triton.jit(do_not_specialize=tuning.NO_SPECIALIZE)
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
    Query head ``h`` reads kv head ``h // group_size``.
    """
    pid_m, pid_bh = heaviest_first(HEAVY_LAST=True)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    kv_h = h // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
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
    qk_scale = scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))

    # Query i sees keys j <= i + diag (bottom-right alignment when n_q != n_k).
    diag = n_k - n_q
    m0 = pid_m * BLOCK_M
    if CAUSAL:
        # Every row of the tile sees keys j < m0 + diag + 1; the last row sees j < m0 + BLOCK_M + diag.
        full_stop = tl.minimum(tl.maximum(m0 + diag + 1, 0), n_k) // BLOCK_N * BLOCK_N
        masked_stop = tl.minimum(tl.maximum(m0 + BLOCK_M + diag, 0), n_k)
    else:
        full_stop = n_k // BLOCK_N * BLOCK_N
        masked_stop = n_k

    acc, m, l = _attend_key_tiles(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  offs_m, offs_d, 0, full_stop, n_k, diag, qk_scale,
                                  False, CAUSAL, D, BLOCK_N, BLOCK_D, PRECISION)
    acc, m, l = _attend_key_tiles(acc, m, l, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  offs_m, offs_d, full_stop, masked_stop, n_k, diag, qk_scale,
                                  True, CAUSAL, D, BLOCK_N, BLOCK_D, PRECISION)

    # A query that saw no key (causal, n_q > n_k) outputs 0 and has lse = -inf.
    seen = l > 0.0
    o = acc / tl.where(seen, l, 1.0)[:, None]
    lse = tl.where(seen, (m + tl.math.log2(tl.where(seen, l, 1.0))) * 0.6931471805599453, float("-inf"))
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * n_q + offs_m, lse, mask=row_ok)

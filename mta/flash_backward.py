"""FlashAttention-2 backward in Triton: a dQ kernel, then a dK/dV kernel.

Nothing of size N x N is stored: each kernel recomputes the probabilities
``P = exp(scale * Q K^T - lse)`` tile by tile from the log-sum-exp the forward
saved. With ``dP = dO V^T`` and ``D_i = rowsum(dO_i * O_i)`` the softmax
gradient is ``dS = P * (dP - D)`` (chapter 03 derives it), and

    dV = P^T dO,    dK = scale * dS^T Q,    dQ = scale * dS K.

dK/dV sum over query rows and dQ over keys, so each gets its own kernel whose
program owns the rows it writes: no atomics. For grouped-query attention the
dK/dV program of a kv head also loops over the query heads that read it.

``D`` needs no launch of its own: a dQ program holds its rows of ``dO`` and
loads their rows of ``O``, makes their ``D`` and stores it, and the dK/dV
kernel, launched after it, reads every row's. :func:`rowsum_do_o_kernel`, the
same sum as a pre-pass, serves the MTA backward, whose first kernel needs ``D``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel_parts import LOG2E, key_tile_bounds, program_coordinates, query_tile_bounds
from .launch import NO_SPECIALIZE


@triton.jit
def rowsum_do_o_kernel(O, DO, DELTA,
                       stride_ob, stride_oh, stride_om, stride_od,
                       stride_dob, stride_doh, stride_dom, stride_dod,
                       n_q, num_heads, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """``DELTA[bh, i] = sum_d dO[i, d] * O[i, d]`` in fp32. Grid: ``(cdiv(n_q, BLOCK_M), B * Hq)``."""
    pid_m, pid_bh, b, h, _ = program_coordinates(num_heads, 1, HEAVY_LAST=False)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < D)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=mask, other=0.0)
    tl.store(DELTA + pid_bh * n_q + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_m < n_q)


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                      stride_qm, stride_qd, stride_dom, stride_dod,
                      offs_n, offs_d, start, stop, n_q, diag, qk_scale,
                      MASKED: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                      PRECISION: tl.constexpr):
    """Accumulate into ``dk, dv [BLOCK_N, BLOCK_D]`` the query tiles ``[start, stop)``.

    Works on transposed scores ``S^T [BLOCK_N, BLOCK_M]`` so that P^T and dS^T
    come out in the layout the dV and dK products need. ``MASKED`` applies the
    causal mask ``i + diag >= j``; rows past ``n_q`` read lse = +inf, so P = 0.
    """
    d_ok = offs_d < D
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_q
        qt = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                     mask=d_ok[:, None] & row_ok[None, :], other=0.0)  # Q^T [BLOCK_D, BLOCK_M]
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        st = tl.dot(k, qt, input_precision=PRECISION) * qk_scale  # S^T, base-2 units
        pt = tl.math.exp2(st - lse2[None, :])
        if MASKED:
            pt = tl.where(offs_m[None, :] + diag >= offs_n[:, None], pt, 0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def flash_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                      stride_qb, stride_qh, stride_qm, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_dob, stride_doh, stride_dom, stride_dod,
                      stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                      stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                      n_q, n_k, num_kv_heads, group_size, scale, N_BUCKET,
                      CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                      PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK, dV for ``BLOCK_N`` keys of one kv head.

    Grid: ``(cdiv(n_k, BLOCK_N), B * Hkv)``, heaviest (first) key tiles first (:mod:`mta.launch_order`).
    """
    pid_n, pid_bh, b, kv_h, _ = program_coordinates(num_kv_heads, 1, HEAVY_LAST=False)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < D)
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E

    # Query i sees key j when i + diag >= j.
    diag = n_k - n_q
    start, m_full = query_tile_bounds(n0, n_q, diag, 0, CAUSAL, BLOCK_M, BLOCK_N)
    for g in range(0, group_size):
        h = kv_h * group_size + g
        bh = b * num_kv_heads * group_size + h
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, LSE + bh * n_q, DELTA + bh * n_q,
                                   stride_qm, stride_qd, stride_dom, stride_dod, offs_n, offs_d,
                                   start, m_full, n_q, diag, qk_scale, True, D, BLOCK_M, BLOCK_D, PRECISION)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, LSE + bh * n_q, DELTA + bh * n_q,
                                   stride_qm, stride_qd, stride_dom, stride_dod, offs_n, offs_d,
                                   m_full, n_q, n_q, diag, qk_scale, False, D, BLOCK_M, BLOCK_D, PRECISION)
    dk = dk * scale
    tl.store(DK + b * stride_dkb + kv_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  offs_m, offs_d, start, stop, n_k, diag, qk_scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """Accumulate into ``dq [BLOCK_M, BLOCK_D]`` the key tiles ``[start, stop)``."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    for start_n in range(start, stop, BLOCK_N):
        offs_k = start_n + offs_n
        kt_mask = d_ok[:, None] & (offs_k[None, :] < n_k)
        kt = tl.load(k_base + offs_k[None, :] * stride_kn + offs_d[:, None] * stride_kd, mask=kt_mask, other=0.0)
        vt = tl.load(v_base + offs_k[None, :] * stride_vn + offs_d[:, None] * stride_vd, mask=kt_mask, other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            keep = offs_k[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_k[None, :] <= offs_m[:, None] + diag)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vt, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=PRECISION)
    return dq


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def flash_dq_kernel(Q, K, V, O, DO, LSE, DELTA, DQ,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                    n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                    CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ for ``BLOCK_M`` queries of one head, and their ``D = rowsum(dO * O)``, stored to ``DELTA [B * Hq,
    n_q]`` (fp32) for the dK/dV kernel.

    Grid: ``(cdiv(n_q, BLOCK_M), B * Hq)``, heaviest (last) query tiles first (:mod:`mta.launch_order`).
    """
    pid_m, pid_bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=True)
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    mask = row_ok[:, None] & (offs_d[None, :] < D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=mask, other=0.0)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=mask, other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)  # D_i = dO_i . O_i
    tl.store(DELTA + pid_bh * n_q + offs_m, delta, mask=row_ok)
    lse2 = tl.load(LSE + pid_bh * n_q + offs_m, mask=row_ok, other=float("inf")) * LOG2E
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E

    diag = n_k - n_q
    full_stop, masked_stop = key_tile_bounds(m0, n_k, diag, 0, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, 0, full_stop, n_k, diag, qk_scale,
                       False, CAUSAL, D, BLOCK_N, BLOCK_D, PRECISION)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, full_stop, masked_stop, n_k, diag, qk_scale,
                       True, CAUSAL, D, BLOCK_N, BLOCK_D, PRECISION)
    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=mask)

"""Experiment: the MTA dK/dV kernel with its scores computed transposed (keys as rows, ``C^T = Kf Q_shift^T``), as
Triton's fused-attention tutorial computes its dK/dV: ``P^T`` and ``dC^T`` are then the left operands of
``dV += P^T dO`` and ``U += dC^T Q_shift`` as they come out of the products, with no register transposes; the
loaded query and dO tiles are read transposed from shared memory instead. Same signature as
``mta.conv_backward.conv_dkdv_kernel``, so ``mta.conv.conv_dkdv_kernel = conv_dkdv_kernel_t`` swaps it in.
"""
import triton
import triton.language as tl

from mta.conv_backward import _store_shifts
from mta.conv_forward import _folded_keys, _shifted_queries
from mta.kernel_parts import LOG2E, program_coordinates, query_tile_bounds
from mta.launch import NO_SPECIALIZE


@triton.jit
def _put_diagonals_t(ct, cd_base, offs_m, offs_k, n, E: tl.constexpr, E_PAD: tl.constexpr):
    """``ct [keys, rows]`` with ``CD[i, i - j]`` on the ``E`` diagonals ``0 <= i - j < E``."""
    delta = offs_m[None, :] - offs_k[:, None]
    row_ok = offs_m < n
    for d in tl.static_range(E):
        cd_d = tl.load(cd_base + offs_m * E_PAD + d, mask=row_ok, other=0.0)
        ct = tl.where(delta == d, cd_d[None, :], ct)
    return ct


@triton.jit
def _dkdv_query_tiles_t(dv, u_hi, u_lo, kft_hi, kft_lo, v_blk, q_base, do_base, lse_base, delta_base, cd_base,
                        stride_qm, stride_qd, stride_dom, stride_dod, offs_k, offs_d, start, stop, n, qk_scale,
                        DIAGONAL: tl.constexpr, MASK_KEYS: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr,
                        QB: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, D: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    d_ok = offs_d < D
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n
        q_hi = _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, 0, QA, CQ, D, BLOCK_D)
        ct = tl.dot(kft_hi, tl.trans(q_hi), input_precision=PRECISION)
        if QB > 0:
            q_lo = _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, QA, QB, CQ, D, BLOCK_D)
            ct = tl.dot(kft_lo, tl.trans(q_lo), ct, input_precision=PRECISION)
        if DIAGONAL:
            ct = _put_diagonals_t(ct, cd_base, offs_m, offs_k, n, E, E_PAD) * qk_scale
            ct = tl.where(offs_m[None, :] - offs_k[:, None] >= 0, ct, float("-inf"))
        else:
            ct = ct * qk_scale
        if MASK_KEYS:
            ct = tl.where((offs_k < n)[:, None], ct, float("-inf"))
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        pt = tl.math.exp2(ct - lse2[None, :])
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        dct = pt * (tl.dot(v_blk, tl.trans(do), input_precision=PRECISION) - delta[None, :])
        if DIAGONAL:
            dct = tl.where(offs_m[None, :] - offs_k[:, None] >= E, dct, 0.0)
        dct = dct.to(q_hi.dtype)
        u_hi = tl.dot(dct, q_hi, u_hi, input_precision=PRECISION)
        if QB > 0:
            u_lo = tl.dot(dct, q_lo, u_lo, input_precision=PRECISION)
    return dv, u_hi, u_lo


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def conv_dkdv_kernel_t(Q, KF, V, DO, LSE, DELTA, CD, U, DV,
                       stride_qb, stride_qh, stride_qm, stride_qd,
                       stride_vb, stride_vh, stride_vn, stride_vd,
                       stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                       stride_dob, stride_doh, stride_dom, stride_dod,
                       stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                       n_q, n_k, num_kv_heads, group_size, scale, N_BUCKET,
                       CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                       E_PAD: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, D: tl.constexpr,
                       BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    n = n_q
    pid_n, pid_bkv, b, kv_h, _ = program_coordinates(num_kv_heads, 1, HEAVY_LAST=False)
    n0 = pid_n * BLOCK_N
    offs_k = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    v_blk = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=(offs_k < n)[:, None] & d_ok[None, :], other=0.0)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E
    start, m_full = query_tile_bounds(n0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    for g in range(0, group_size):
        h = kv_h * group_size + g
        bh = b * num_kv_heads * group_size + h
        kf_base = KF + b * stride_kfb + h * stride_kfh
        kft_hi = tl.trans(_folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, 0, QA, CQ, D,
                                       BLOCK_D))
        if QB > 0:
            kft_lo = tl.trans(_folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, QA, QB, CQ, D,
                                           BLOCK_D))
        else:
            kft_lo = kft_hi
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        u_hi = tl.zeros([BLOCK_N, QA * BLOCK_D], dtype=tl.float32)
        if QB > 0:
            u_lo = tl.zeros([BLOCK_N, QB * BLOCK_D], dtype=tl.float32)
        else:
            u_lo = u_hi
        dv, u_hi, u_lo = _dkdv_query_tiles_t(dv, u_hi, u_lo, kft_hi, kft_lo, v_blk, q_base, do_base, LSE + bh * n,
                                             DELTA + bh * n, CD + bh * n * E_PAD, stride_qm, stride_qd, stride_dom,
                                             stride_dod, offs_k, offs_d, start, m_full, n, qk_scale, CAUSAL, False,
                                             CQ, QA, QB, E, E_PAD, D, BLOCK_D, BLOCK_M, PRECISION)
        dv, u_hi, u_lo = _dkdv_query_tiles_t(dv, u_hi, u_lo, kft_hi, kft_lo, v_blk, q_base, do_base, LSE + bh * n,
                                             DELTA + bh * n, CD + bh * n * E_PAD, stride_qm, stride_qd, stride_dom,
                                             stride_dod, offs_k, offs_d, m_full, n, n, qk_scale, False, not CAUSAL,
                                             CQ, QA, QB, E, E_PAD, D, BLOCK_D, BLOCK_M, PRECISION)
        u_base = U + bh * CQ * n * D
        _store_shifts(u_base, n * D, D, u_hi, offs_k, n, 0, QA, CQ, D, BLOCK_D)
        if QB > 0:
            _store_shifts(u_base, n * D, D, u_lo, offs_k, n, QA, QB, CQ, D, BLOCK_D)
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_k[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=(offs_k < n)[:, None] & d_ok[None, :])

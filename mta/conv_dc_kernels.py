"""Phase 1 of the two-phase MTA backward (:mod:`mta.conv_two_phase`): the far part of ``dC``, stored.

Notation of :mod:`mta.conv_backward`. Where the ``cq`` shifted query tiles do not fit on chip (d = 128), the
one-pass kernels of :mod:`mta.conv_backward` make ``C`` against a held ``[rows, cq' d]`` block in narrow tiles, far
below the forward's rate. Here a program owns a key tile of a chunk of keys and a query head, and walks its query
tiles in the forward's 128 x 128 tiles, the score product's depth streamed
through the copy engine as the forward streams it, its operands swapped (keys as rows, ``C^T = Kf Q_shift^T``, as
Triton's fused-attention tutorial makes its dK/dV). ``P^T`` then is the left operand of ``dV += P^T dO`` as it
comes out of its product, the head's part of ``dV`` is summed in registers, and
``dC_far`` is stored, rows-major (its tile transposed back), to a 16-bit scratch of one chunk (the one-pass kernels
round ``dC`` to the inputs' dtype for their products too): the dQ side then reads rows of it shifted by whole
rows (:mod:`mta.conv_dq_kernels`), and ``U = dC_far^T Q_shift`` is a plain GEMM over the chunk, whose right
operand :func:`shifted_queries_kernel` lays out.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .conv_tiles import finish_scores, score_gradient, shifted_query_tile
from .kernel_parts import LOG2E, program_coordinates, query_tile_bounds
from .launch import NO_SPECIALIZE

#: Meta-parameters derived at launch: the copy engine where the launcher made descriptors.
HEURISTICS = {"TMA": lambda args: args["QD"] is not None}


@triton.jit
def _folded_scores_keys_as_rows(q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, QD, KFD,
                                b, h, i0, j0, offs_m, offs_k, n, TMA: tl.constexpr, CQ: tl.constexpr,
                                D: tl.constexpr, BLOCK_D: tl.constexpr, WIDTH: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """``[BLOCK_N, BLOCK_M]``: ``C^T[j, i] = sum_a Kf_a[j] . q_{i-(cq-1)+a}`` (unscaled), ``cq * BLOCK_D / WIDTH``
    products of depth ``WIDTH``. ``TMA``: the pieces come through ``QD`` (rows before 0 or past ``n``
    zero-filled) and ``KFD``; else pointer loads."""
    PARTS: tl.constexpr = BLOCK_D // WIDTH
    offs_w = tl.arange(0, WIDTH)
    ct = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for s in range(PARTS * CQ):
        a = s // PARTS
        d0 = (s % PARTS) * WIDTH
        if TMA:
            q_a = QD.load([b, h, i0 - (CQ - 1) + a, d0]).reshape(BLOCK_M, WIDTH)
            kf_a = KFD.load([b, h, a, j0, d0]).reshape(BLOCK_N, WIDTH)
        else:
            dd = d0 + offs_w
            q_a = shifted_query_tile(q_base, stride_qm, stride_qd, offs_m, dd, n, a, CQ, D)
            kf_a = tl.load(kf_base + a * stride_kfa + offs_k[:, None] * stride_kfn + dd[None, :] * stride_kfd,
                           mask=(offs_k < n)[:, None] & (dd < D)[None, :], other=0.0)
        ct = tl.dot(kf_a, tl.trans(q_a), ct, input_precision=PRECISION)
    return ct


@triton.jit
def _dc_query_tiles(dv, v, DCD, dcs_base, stride_sm, c0, row0, q_base, kf_base, do_base, lse_base, delta_base,
                    stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_dom, stride_dod, QD, KFD, DOD,
                    cd_base, b, h, bh, j0, offs_k, offs_d, start, stop, n, qk_scale, DIAGONAL: tl.constexpr,
                    MASK_KEYS: tl.constexpr, TMA: tl.constexpr, CQ: tl.constexpr, E: tl.constexpr,
                    E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, WIDTH: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Query tiles ``[start, stop)`` of one query head against the key tile at ``j0``: ``dv += P^T dO`` and
    ``dC_far`` stored to the chunk's scratch (rows from ``row0``, keys from ``c0``): the tile body of
    :mod:`mta.conv_tiles`. ``DIAGONAL``: the masked diagonals put in, the causal mask, and ``dC`` kept only where
    ``i - j >= E``; ``MASK_KEYS``: keys past ``n``."""
    k_ok = offs_k < n
    d_ok = offs_d < D
    for i0 in tl.range(start, stop, BLOCK_M, flatten=TMA):
        offs_m = i0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n
        ct = _folded_scores_keys_as_rows(q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                                         QD, KFD, b, h, i0, j0, offs_m, offs_k, n, TMA, CQ, D, BLOCK_D, WIDTH,
                                         BLOCK_M, BLOCK_N, PRECISION)
        ct = finish_scores(ct, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, MASK_KEYS, True, E, E_PAD)
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E  # rows past n: P = 0
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        if TMA:
            do = DOD.load([b, h, i0, 0]).reshape(BLOCK_M, BLOCK_D)
        else:
            do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        pt = tl.math.exp2(ct - lse2[None, :])
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        dct = score_gradient(pt, do, v, delta, offs_m, offs_k, DIAGONAL, True, E, PRECISION)
        dct = dct.to(do.dtype)
        if TMA:  # the descriptor's bounds clip the rows past n
            DCD.store([bh, i0 - row0, j0 - c0], tl.trans(dct).reshape(1, BLOCK_M, BLOCK_N))
        else:
            tl.store(dcs_base + (offs_k - c0)[:, None] + (offs_m - row0)[None, :] * stride_sm, dct,
                     mask=k_ok[:, None] & row_ok[None, :])
    return dv


@triton.heuristics(HEURISTICS)
@triton.jit(do_not_specialize=NO_SPECIALIZE + ["c0", "row0"])
def conv_dc_kernel(Q, KF, V, DO, LSE, DELTA, CD, DCS, DV, QD, KFD, DOD, DCD,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                   stride_dob, stride_doh, stride_dom, stride_dod,
                   stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                   stride_sb, stride_sm, n_q, n_k, c0, row0, num_heads, group_size, scale, N_BUCKET,
                   CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                   E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, WIDTH: tl.constexpr):
    """``DCS[b * Hq + h, i - row0, j - c0] = dC_far[i, j]`` (dO's dtype; rows-major) for the key tile ``pid``-th
    of the chunk of keys from ``c0``, query head ``h`` (kv head ``h // group_size``) and every row ``i`` from
    ``row0`` (the chunk's first key when causal, else 0): made where the row sees the key, 0 where it does not (the
    future, and the near diagonals, which :func:`mta.conv_backward.conv_near_kernel` takes). ``DV [B, Hq, N, D]``:
    head ``h``'s part of ``dV``, ``P^T dO`` for the tile's keys (the launcher sums a GQA group's parts; with no
    groups it is ``dv``). ``KF``, ``CD``: the forward's folded keys and diagonal scores; ``QD``, ``KFD``, ``DOD``,
    ``DCD``: TMA descriptors over ``q``, ``KF``, ``dO`` and the scratch (``[B * Hq, rows, keys]``, boxes of the
    tile), or all None (pointer loads and stores).

    Grid: ``(keys of the chunk / BLOCK_N, B * Hq)``, heaviest (first) key tiles first: a program per query head,
    so that a chunk of a few key tiles still fills the GPU where a batch has few kv heads.
    """
    n = n_q
    pid_n, bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=False)
    j0 = c0 + pid_n * BLOCK_N
    offs_k = j0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_ok = offs_k < n
    d_ok = offs_d < D
    v = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=k_ok[:, None] & d_ok[None, :], other=0.0)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E
    # Rows before `start` see none of these keys; from `m_full` on, every row is at least E past all of them.
    start, m_full = query_tile_bounds(j0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    dcs_base = DCS + bh * stride_sb
    for i0 in range(row0, start, BLOCK_M):  # the future of every key of the tile: zeros for the GEMMs
        offs_m = i0 + tl.arange(0, BLOCK_M)
        zeros = tl.zeros([BLOCK_N, BLOCK_M], dtype=DCS.dtype.element_ty)
        if TMA:
            DCD.store([bh.to(tl.int32), i0 - row0, j0 - c0], zeros.reshape(1, BLOCK_M, BLOCK_N))
        else:
            tl.store(dcs_base + (offs_k - c0)[:, None] + (offs_m - row0)[None, :] * stride_sm, zeros,
                     mask=k_ok[:, None] & (offs_m < start)[None, :])
    q_base = Q + b * stride_qb + h * stride_qh
    kf_base = KF + b * stride_kfb + h * stride_kfh
    do_base = DO + b * stride_dob + h * stride_doh
    lse_base = LSE + bh * n
    delta_base = DELTA + bh * n
    cd_base = CD + bh * n * E_PAD
    b32, h32, bh32 = b.to(tl.int32), h.to(tl.int32), bh.to(tl.int32)  # descriptor coordinates
    dv = _dc_query_tiles(dv, v, DCD, dcs_base, stride_sm, c0, row0, q_base, kf_base, do_base, lse_base,
                         delta_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_dom,
                         stride_dod, QD, KFD, DOD, cd_base, b32, h32, bh32, j0, offs_k, offs_d, start, m_full, n,
                         qk_scale, CAUSAL, False, TMA, CQ, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N,
                         PRECISION)
    dv = _dc_query_tiles(dv, v, DCD, dcs_base, stride_sm, c0, row0, q_base, kf_base, do_base, lse_base,
                         delta_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_dom,
                         stride_dod, QD, KFD, DOD, cd_base, b32, h32, bh32, j0, offs_k, offs_d, m_full, n, n,
                         qk_scale, False, not CAUSAL, TMA, CQ, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N,
                         PRECISION)
    tl.store(DV + b * stride_dvb + h * stride_dvh + offs_k[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=k_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def shifted_queries_kernel(Q, QS, stride_qb, stride_qh, stride_qm, stride_qd, n, num_heads, CQ: tl.constexpr,
                           D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """``QS[b * Hq + h, i, a * D + d] = q[b, h, i - (CQ-1) + a, d]`` (0 before row 0): the queries of every shift
    of the convolution side by side, contiguous ``[B * Hq, n, CQ * D]``. Grid: ``(cdiv(n, BLOCK_R), B * Hq)``;
    memory-bound, the ``CQ`` shifted loads of a tile hit the cache after the first."""
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_r < n)[:, None] & (offs_d < D)[None, :]
    q_base = Q + b * stride_qb + h * stride_qh
    out = QS + pid_bh * n * CQ * D + offs_r[:, None] * (CQ * D) + offs_d[None, :]
    for a in tl.static_range(CQ):
        tl.store(out + a * D, shifted_query_tile(q_base, stride_qm, stride_qd, offs_r, offs_d, n, a, CQ, D),
                 mask=ok)

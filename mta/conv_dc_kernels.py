"""Phase 1 of the two-phase MTA backward (:mod:`mta.conv_two_phase`): the far part of ``dC``, stored.

Notation of :mod:`mta.conv_backward`. Where the ``cq`` shifted query tiles do not fit on chip (d = 128), the
one-pass kernels of :mod:`mta.conv_backward` make ``C`` against a held ``[rows, cq' d]`` block in narrow tiles, far
below the forward's rate. Here ``C`` is made exactly as the forward's streamed path makes it (128 x 128 tiles,
the score product's depth through TMA: :func:`mta.conv_forward._folded_scores`), and instead of the products of
width ``cq' d`` the programs store ``dC_far`` (16-bit, the dtype of the inputs) to a scratch of one chunk of rows
or keys; the products ``Gq = dC_far Kf`` and ``U = dC_far^T Qshift`` are then plain GEMMs over the chunk.

* :func:`conv_dc_rows_kernel` (dQ side): a program owns a query tile of a chunk of rows and walks its key tiles,
  storing ``dC_far[i, j]`` for the chunk's rows and the keys up to the chunk's end (zeros past its diagonal).
* :func:`conv_dc_keys_kernel` (dK/dV side): a program owns a key tile of a chunk of keys and a kv head, and walks
  the query tiles of each query head of its group, storing ``dC_far[i, j]`` (zeros for the rows before its
  diagonal) and summing ``dV = P^T dO`` over the group in registers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .conv_forward import _finish_scores, _folded_scores, query_shift_groups, stream_width
from .kernel_parts import LOG2E, key_tile_bounds, program_coordinates, query_tile_bounds
from .launch import NO_SPECIALIZE

#: Meta-parameters derived at launch: the query shifts in two power-of-two groups, the copy engine where the
#: launcher made descriptors, and the depth of one streamed product (:func:`mta.conv_forward.stream_width`).
HEURISTICS = {"QA": lambda args: query_shift_groups(args["CQ"])[0],
              "QB": lambda args: query_shift_groups(args["CQ"])[1],
              "TMA": lambda args: args["QD"] is not None,
              "WIDTH": lambda args: stream_width(args["BLOCK_D"])}


@triton.jit
def _convolved_tile(q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, QD, KFD, cd_base,
                    b, h, i0, j0, offs_m, offs_k, n, qk_scale, DIAGONAL: tl.constexpr, MASK_KEYS: tl.constexpr,
                    TMA: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, E: tl.constexpr,
                    E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, WIDTH: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """``C [BLOCK_M, BLOCK_N]`` in base-2 units for the rows ``offs_m = i0 + ...`` and keys ``offs_k = j0 + ...``,
    made as the forward's streamed path makes it. ``DIAGONAL``: the masked diagonals put in and the causal mask;
    ``MASK_KEYS``: keys past ``n`` get ``-inf``."""
    c = _folded_scores(0.0, 0.0, q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                       QD, KFD, b, h, i0, j0, offs_m, offs_k, n, False, TMA, CQ, QA, QB, D, BLOCK_D, WIDTH,
                       BLOCK_M, BLOCK_N, PRECISION)
    c = _finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, E, E_PAD)
    if MASK_KEYS:
        c = tl.where((offs_k < n)[None, :], c, float("-inf"))
    return c


@triton.jit
def _far_dc(c, lse2, delta, do, v, offs_m, offs_k, DIAGONAL: tl.constexpr, E: tl.constexpr,
            PRECISION: tl.constexpr):
    """``(P, dC_far)`` of a tile of convolved scores ``c`` (base-2 units): ``P = exp2(c - lse2)``,
    ``dC = P (dO v^T - Delta)``, kept only where ``i - j >= E`` on a ``DIAGONAL`` tile."""
    p = tl.math.exp2(c - lse2[:, None])
    dc = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
    if DIAGONAL:
        dc = tl.where(offs_m[:, None] - offs_k[None, :] >= E, dc, 0.0)
    return p, dc


@triton.jit
def _dc_key_tiles(dcs_base, stride_sm, r0, do, lse2, delta, q_base, kf_base, v_base, stride_qm, stride_qd,
                  stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, cd_base, b, h, kv_h, i0,
                  offs_m, offs_d, start, stop, n, qk_scale, DIAGONAL: tl.constexpr, MASK_KEYS: tl.constexpr,
                  TMA: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, E: tl.constexpr,
                  E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, WIDTH: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Key tiles ``[start, stop)`` of the query tile at ``i0``: ``dC_far`` stored to the chunk's scratch (rows from
    ``r0``)."""
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < n
    for j0 in tl.range(start, stop, BLOCK_N, flatten=TMA):
        offs_k = j0 + offs_n
        k_ok = offs_k < n
        c = _convolved_tile(q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, QD, KFD,
                            cd_base, b, h, i0, j0, offs_m, offs_k, n, qk_scale, DIAGONAL, MASK_KEYS or DIAGONAL,
                            TMA, CQ, QA, QB, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
        if TMA:
            v = VD.load([b, kv_h, j0, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=k_ok[:, None] & (offs_d < D)[None, :], other=0.0)
        _, dc = _far_dc(c, lse2, delta, do, v, offs_m, offs_k, DIAGONAL, E, PRECISION)
        tl.store(dcs_base + (offs_m - r0)[:, None] * stride_sm + offs_k[None, :], dc.to(do.dtype),
                 mask=row_ok[:, None] & k_ok[None, :])


@triton.heuristics(HEURISTICS)
@triton.jit(do_not_specialize=NO_SPECIALIZE + ["r0", "k_end"])
def conv_dc_rows_kernel(Q, KF, V, DO, LSE, DELTA, CD, DCS, QD, KFD, VD,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                        stride_dob, stride_doh, stride_dom, stride_dod,
                        stride_sb, stride_sm, n_q, n_k, r0, k_end, num_heads, group_size, scale, N_BUCKET,
                        CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                        E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr,
                        TMA: tl.constexpr, WIDTH: tl.constexpr):
    """``DCS[b * Hq + h, i - r0, j] = dC_far[i, j]`` (dO's dtype) for the query tile ``pid``-th of the chunk of rows
    from ``r0`` and every key ``j < k_end`` (the chunk's last row + 1 when causal, else ``n``): made where the row
    sees the key, 0 where it does not (the future, and the near diagonals, which
    :func:`mta.conv_backward.conv_near_kernel` takes). ``KF``, ``CD``: the forward's folded keys and diagonal scores; ``QD``, ``KFD``, ``VD``: TMA descriptors
    (boxes of the forward's streamed tile) or None.

    Grid: ``(rows of the chunk / BLOCK_M, B * Hq)``, heaviest (last) query tiles first.
    """
    n = n_q
    pid_m, pid_bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=True)
    i0 = r0 + pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n
    q_base = Q + b * stride_qb + h * stride_qh
    v_base = V + b * stride_vb + kv_h * stride_vh
    kf_base = KF + b * stride_kfb + h * stride_kfh
    cd_base = CD + pid_bh * n * E_PAD
    dcs_base = DCS + pid_bh * stride_sb
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    lse2 = tl.load(LSE + pid_bh * n + offs_m, mask=row_ok, other=float("inf")) * LOG2E  # rows past n: P = 0
    delta = tl.load(DELTA + pid_bh * n + offs_m, mask=row_ok, other=0.0)
    qk_scale = scale * LOG2E
    b32, h32, kv_h32 = b.to(tl.int32), h.to(tl.int32), kv_h.to(tl.int32)  # descriptor coordinates

    full_stop, masked_stop = key_tile_bounds(i0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    _dc_key_tiles(dcs_base, stride_sm, r0, do, lse2, delta, q_base, kf_base, v_base, stride_qm, stride_qd,
                  stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, cd_base, b32, h32, kv_h32,
                  i0, offs_m, offs_d, 0, full_stop, n, qk_scale, False, False, TMA, CQ, QA, QB, E, E_PAD, D,
                  BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    _dc_key_tiles(dcs_base, stride_sm, r0, do, lse2, delta, q_base, kf_base, v_base, stride_qm, stride_qd,
                  stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, cd_base, b32, h32, kv_h32,
                  i0, offs_m, offs_d, full_stop, masked_stop, n, qk_scale, CAUSAL, not CAUSAL, TMA, CQ, QA, QB, E,
                  E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    # The keys past this tile's diagonal up to the chunk's end are the future: zeros for the chunk's GEMM.
    offs_n = tl.arange(0, BLOCK_N)
    for j0 in range(masked_stop, k_end, BLOCK_N):
        offs_k = j0 + offs_n
        tl.store(dcs_base + (offs_m - r0)[:, None] * stride_sm + offs_k[None, :],
                 tl.zeros([BLOCK_M, BLOCK_N], dtype=DCS.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_k < k_end)[None, :])


@triton.jit
def _dc_query_tiles(dv, v, dcs_base, stride_sm, c0, row0, q_base, kf_base, do_base, lse_base, delta_base,
                    stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_dom, stride_dod, QD, KFD,
                    cd_base, b, h, j0, offs_k, offs_d, start, stop, n, qk_scale, DIAGONAL: tl.constexpr,
                    MASK_KEYS: tl.constexpr, TMA: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr,
                    QB: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Query tiles ``[start, stop)`` of one query head against the key tile at ``j0``: ``dv += P^T dO`` and
    ``dC_far`` stored to the chunk's scratch (rows from ``row0``, keys from ``c0``)."""
    k_ok = offs_k < n
    d_ok = offs_d < D
    for i0 in tl.range(start, stop, BLOCK_M, flatten=TMA):
        offs_m = i0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n
        c = _convolved_tile(q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, QD, KFD,
                            cd_base, b, h, i0, j0, offs_m, offs_k, n, qk_scale, DIAGONAL, MASK_KEYS, TMA, CQ, QA,
                            QB, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E  # rows past n: P = 0
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        p, dc = _far_dc(c, lse2, delta, do, v, offs_m, offs_k, DIAGONAL, E, PRECISION)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision=PRECISION)
        tl.store(dcs_base + (offs_m - row0)[:, None] * stride_sm + (offs_k - c0)[None, :], dc.to(do.dtype),
                 mask=row_ok[:, None] & k_ok[None, :])
    return dv


@triton.heuristics(HEURISTICS)
@triton.jit(do_not_specialize=NO_SPECIALIZE + ["c0", "row0"])
def conv_dc_keys_kernel(Q, KF, V, DO, LSE, DELTA, CD, DCS, DV, QD, KFD, VD,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                        stride_dob, stride_doh, stride_dom, stride_dod,
                        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                        stride_sb, stride_sm, n_q, n_k, c0, row0, num_kv_heads, group_size, scale, N_BUCKET,
                        CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                        E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr,
                        TMA: tl.constexpr, WIDTH: tl.constexpr):
    """``DCS[b * Hq + h, i - row0, j - c0] = dC_far[i, j]`` (dO's dtype) for the key tile ``pid``-th of the chunk
    of keys from ``c0``, every query head ``h`` of kv head ``kv_h``'s group and every row ``i`` from ``row0`` (the
    chunk's first key when causal, else 0): made where the row sees the key, 0 where it does not. ``DV`` (v's
    dtype): ``dV = sum over the group of P^T dO`` for the tile's keys. ``VD`` is unused (the program loads its
    values once).

    Grid: ``(keys of the chunk / BLOCK_N, B * Hkv)``, heaviest (first) key tiles first.
    """
    n = n_q
    pid_n, pid_bkv, b, kv_h, _ = program_coordinates(num_kv_heads, 1, HEAVY_LAST=False)
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
    for g in range(0, group_size):
        h = kv_h * group_size + g
        bh = b * num_kv_heads * group_size + h
        dcs_base = DCS + bh * stride_sb
        for i0 in range(row0, start, BLOCK_M):  # the future of every key of the tile: zeros for the GEMM
            offs_m = i0 + tl.arange(0, BLOCK_M)
            tl.store(dcs_base + (offs_m - row0)[:, None] * stride_sm + (offs_k - c0)[None, :],
                     tl.zeros([BLOCK_M, BLOCK_N], dtype=DCS.dtype.element_ty),
                     mask=(offs_m < start)[:, None] & k_ok[None, :])
        q_base = Q + b * stride_qb + h * stride_qh
        kf_base = KF + b * stride_kfb + h * stride_kfh
        do_base = DO + b * stride_dob + h * stride_doh
        lse_base = LSE + bh * n
        delta_base = DELTA + bh * n
        cd_base = CD + bh * n * E_PAD
        h32 = h.to(tl.int32)
        dv = _dc_query_tiles(dv, v, dcs_base, stride_sm, c0, row0, q_base, kf_base, do_base, lse_base, delta_base,
                             stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_dom, stride_dod, QD,
                             KFD, cd_base, b.to(tl.int32), h32, j0, offs_k, offs_d, start, m_full, n, qk_scale,
                             CAUSAL, False, TMA, CQ, QA, QB, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N,
                             PRECISION)
        dv = _dc_query_tiles(dv, v, dcs_base, stride_sm, c0, row0, q_base, kf_base, do_base, lse_base, delta_base,
                             stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_dom, stride_dod, QD,
                             KFD, cd_base, b.to(tl.int32), h32, j0, offs_k, offs_d, m_full, n, n, qk_scale, False,
                             not CAUSAL, TMA, CQ, QA, QB, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_k[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=k_ok[:, None] & d_ok[None, :])

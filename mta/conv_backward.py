"""MTA backward in Triton: dq, dk, dv and dweight of the fused key-query convolution, O(N) memory.

Notation of :mod:`mta.conv_forward`: ``pk = (ck-1)/2``, ``E = cq - 1 + pk``, ``E' = ck + cq - 3``,
``S = scale * Q K^T``, ``C = conv(S0, W)``, ``P = softmax(C)``, ``O = P V``. With ``dP = dO V^T`` and
``Delta_i = rowsum(dO_i * O_i)`` the softmax gives ``dC = P * (dP - Delta)`` and ``dV = P^T dO`` (summed over
a GQA group). The convolution's backward (``docs/mta-semantics.md``) is then split so that it stays *exactly*
causal, with nothing subtracted:

* **Far part** ``dC_far``: ``dC`` off the ``E`` diagonals ``0 <= i - j < E`` (all of ``dC`` when not causal).
  Every score it reaches through the convolution is a past (or present) one, so the folded form is exact:

      Gq_a[i] = sum_j dC_far[i, j] Kf_a[j]                 dq[r] = scale * sum_a Gq_a[r + (cq-1) - a]
      U_a[j]  = sum_i dC_far[i, j] q[i - (cq-1) + a]       dk[c] = scale * sum_{h, a, b} W[h, a, b] U_{h,a}[c + pk - b]
                                                           dW[a, b] = scale * sum_c <U_a[c + pk - b], k[c]>

  :func:`conv_dq_kernel` (one program per query tile) recomputes the tiles of ``C`` as the forward does and
  accumulates ``Gq`` for all shifts side by side (one product of width ``cq * D``);
  :func:`conv_dkdv_kernel` (one program per key tile and kv head, looping over the group's query heads)
  accumulates ``dV`` and ``U``. Two folds transposed finish them: :func:`conv_dq_fold_kernel` and
  :func:`conv_dk_fold_kernel` (which also reduces the kernel's gradient per key tile).
* **Near part** (causal only): ``DC[i, delta] = dC[i, i - delta]`` on the ``E`` diagonals, rebuilt from the
  forward's diagonal scores ``CD``, the lse, ``Delta`` and the past products ``dO_i . v_{i-delta}``. Through the
  masked convolution it reaches the scores ``S[r, r - e]``, ``0 <= e <= E'`` only (the entries it would put on
  future scores are exactly the ones the pre-convolution mask removes), as
  ``G[r, e] = sum_a sum_delta DC[r + (cq-1) - a, delta] W[a, a - e + delta + pk - (cq-1)]``
  (the transpose of :func:`mta.conv_forward.diagonal_scores_kernel`); :func:`conv_near_kernel` makes ``G`` and the
  kernel's gradient from these diagonals, and the folds add ``scale * sum_e G[r, e] k[r - e]`` to ``dq[r]`` and
  ``scale * sum_e G[c + e, e] q[c + e]`` to ``dk[c]``.

Deterministic (no atomics; the kernel's gradient is a fixed-order ``torch.sum`` over per-program partials).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .conv_tiles import by_row, finish_scores, folded_keys, score_gradient, shifted_queries
from .kernel_parts import LOG2E, key_tile_bounds, program_coordinates, query_tile_bounds, split_product
from .launch import NO_SPECIALIZE

@triton.jit
def _store_shifts(base, stride_a, stride_n, acc, offs_n, n, A0: tl.constexpr, NA: tl.constexpr,
                  CQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store ``acc [ROWS, NA * BLOCK_D]`` (column ``a' * BLOCK_D + d``: shift ``A0 + a'``) to
    ``base[a, row, d]`` (rows ``offs_n``, contiguous ``d``), shifts ``>= CQ`` and rows ``>= n`` left out."""
    cols = tl.arange(0, NA * BLOCK_D)
    a = A0 + cols // BLOCK_D
    d = cols % BLOCK_D
    ok = (offs_n < n)[:, None] & ((a < CQ) & (d < D))[None, :]
    tl.store(base + a[None, :] * stride_a + offs_n[:, None] * stride_n + d[None, :], acc, mask=ok)


@triton.jit
def _dq_key_tiles(gq_hi, gq_lo, q_hi, q_lo, do, lse2, delta, kf_base, v_base, stride_kfa, stride_kfn, stride_kfd,
                  stride_vn, stride_vd, cd_base, offs_m, offs_d, start, stop, n, qk_scale,
                  MASKED: tl.constexpr, DIAGONAL: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr,
                  QB: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Key tiles ``[start, stop)`` into ``Gq`` (``gq_hi``: shifts ``[0, QA)``, ``gq_lo``: ``[QA, QA + QB)``).

    Per tile: the folded scores as the forward's held-query path makes them (one or two products against the
    folded keys), the tile body of :mod:`mta.conv_tiles` (``MASKED``: the key tail, ``DIAGONAL``: the tiles near
    the diagonal), then ``Gq += dC_far Kf`` with the same folded-key tiles, transposed."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        offs_k = start_n + offs_n
        kf_hi = folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, 0, QA, CQ, D, BLOCK_D)
        c = tl.dot(q_hi, kf_hi, input_precision=PRECISION)
        if QB > 0:
            kf_lo = folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, QA, QB, CQ, D, BLOCK_D)
            c = tl.dot(q_lo, kf_lo, c, input_precision=PRECISION)
        c = finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, MASKED, False, E, E_PAD)
        p = tl.math.exp2(c - lse2[:, None])
        vt = tl.load(v_base + offs_k[None, :] * stride_vn + offs_d[:, None] * stride_vd,
                     mask=(offs_d < D)[:, None] & (offs_k < n)[None, :], other=0.0)
        dc = score_gradient(p, do, vt, delta, offs_m, offs_k, DIAGONAL, False, E, PRECISION)
        dc = dc.to(kf_hi.dtype)
        gq_hi = tl.dot(dc, tl.trans(kf_hi), gq_hi, input_precision=PRECISION)
        if QB > 0:
            gq_lo = tl.dot(dc, tl.trans(kf_lo), gq_lo, input_precision=PRECISION)
    return gq_hi, gq_lo


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def conv_dq_kernel(Q, KF, V, DO, LSE, DELTA, CD, GQ,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                   stride_dob, stride_doh, stride_dom, stride_dod,
                   n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                   CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
                   QA: tl.constexpr, QB: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``GQ[b, h, a, i] = sum_j dC_far[i, j] Kf_a[j]`` (fp32, contiguous ``[B, Hq, CQ, n, D]``) for ``BLOCK_M``
    queries of one head. ``KF``, ``CD``: the forward's folded keys and diagonal scores.

    Grid: ``(cdiv(n, BLOCK_M), B * Hq)``, heaviest (last) query tiles first (:mod:`mta.launch_order`).
    """
    n = n_q
    pid_m, pid_bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=True)
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n
    q_base = Q + b * stride_qb + h * stride_qh
    q_hi = shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, 0, QA, CQ, D, BLOCK_D)
    if QB > 0:
        q_lo = shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, QA, QB, CQ, D, BLOCK_D)
    else:
        q_lo = q_hi
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    lse2 = tl.load(LSE + pid_bh * n + offs_m, mask=row_ok, other=float("inf")) * LOG2E  # rows past n: P = 0
    delta = tl.load(DELTA + pid_bh * n + offs_m, mask=row_ok, other=0.0)
    kf_base = KF + b * stride_kfb + h * stride_kfh
    v_base = V + b * stride_vb + kv_h * stride_vh
    cd_base = CD + pid_bh * n * E_PAD
    gq_hi = tl.zeros([BLOCK_M, QA * BLOCK_D], dtype=tl.float32)
    if QB > 0:
        gq_lo = tl.zeros([BLOCK_M, QB * BLOCK_D], dtype=tl.float32)
    else:
        gq_lo = gq_hi  # unused
    qk_scale = scale * LOG2E

    clean_stop, stop = key_tile_bounds(i0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    gq_hi, gq_lo = _dq_key_tiles(gq_hi, gq_lo, q_hi, q_lo, do, lse2, delta, kf_base, v_base, stride_kfa,
                                 stride_kfn, stride_kfd, stride_vn, stride_vd, cd_base, offs_m, offs_d, 0,
                                 clean_stop, n, qk_scale, False, False, CQ, QA, QB, E, E_PAD, D, BLOCK_D, BLOCK_N,
                                 PRECISION)
    gq_hi, gq_lo = _dq_key_tiles(gq_hi, gq_lo, q_hi, q_lo, do, lse2, delta, kf_base, v_base, stride_kfa,
                                 stride_kfn, stride_kfd, stride_vn, stride_vd, cd_base, offs_m, offs_d, clean_stop,
                                 stop, n, qk_scale, not CAUSAL, CAUSAL, CQ, QA, QB, E, E_PAD, D, BLOCK_D, BLOCK_N,
                                 PRECISION)
    gq_base = GQ + pid_bh * CQ * n * D
    _store_shifts(gq_base, n * D, D, gq_hi, offs_m, n, 0, QA, CQ, D, BLOCK_D)
    if QB > 0:
        _store_shifts(gq_base, n * D, D, gq_lo, offs_m, n, QA, QB, CQ, D, BLOCK_D)


@triton.jit
def _dkdv_query_tiles(dv, u_hi, u_lo, kf_hi, kf_lo, vt, q_base, do_base, lse_base, delta_base, cd_base,
                      stride_qm, stride_qd, stride_dom, stride_dod, offs_k, offs_d, start, stop, n, qk_scale,
                      DIAGONAL: tl.constexpr, MASK_KEYS: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr,
                      QB: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, D: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr,
                      KEYS_AS_ROWS: tl.constexpr):
    """Query tiles ``[start, stop)`` of one query head into ``dv`` and ``U`` (``u_hi``, ``u_lo``: shifts as in
    :func:`_dq_key_tiles`), against the program's held folded keys ``kf_hi``, ``kf_lo`` and values ``vt``.

    The folded scores are made as the forward makes them (the same shifted-query tiles, the same products), then
    the tile body of :mod:`mta.conv_tiles`. ``DIAGONAL``: rows within ``E`` of the keys. ``MASK_KEYS``: keys past
    ``n`` get P = 0 (not causal; causally they are in the future of every row). Rows past ``n`` read
    lse = +inf, so P = 0. ``KEYS_AS_ROWS``: the scores made transposed, keys as rows
    (``C^T = Kf Q_shift^T``, as Triton's fused-attention tutorial makes its dK/dV): ``P^T`` and ``dC^T`` leave
    their products as the left operands of ``dV += P^T dO`` and ``U += dC^T Q_shift``, and the held operands are
    transposed once, before the walk."""
    if KEYS_AS_ROWS:
        kf_hi = tl.trans(kf_hi)
        kf_lo = tl.trans(kf_lo)
        v = tl.trans(vt)
    else:
        v = vt
    d_ok = offs_d < D
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n
        q_hi = shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, 0, QA, CQ, D, BLOCK_D)
        if KEYS_AS_ROWS:
            c = tl.dot(kf_hi, tl.trans(q_hi), input_precision=PRECISION)
        else:
            c = tl.dot(q_hi, kf_hi, input_precision=PRECISION)
        if QB > 0:
            q_lo = shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, QA, QB, CQ, D, BLOCK_D)
            if KEYS_AS_ROWS:
                c = tl.dot(kf_lo, tl.trans(q_lo), c, input_precision=PRECISION)
            else:
                c = tl.dot(q_lo, kf_lo, c, input_precision=PRECISION)
        c = finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, MASK_KEYS, KEYS_AS_ROWS, E, E_PAD)
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        p = tl.math.exp2(c - by_row(lse2, KEYS_AS_ROWS))
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if KEYS_AS_ROWS:  # p is P^T
            dv = tl.dot(p.to(do.dtype), do, dv, input_precision=PRECISION)
        else:
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision=PRECISION)
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        dc = score_gradient(p, do, v, delta, offs_m, offs_k, DIAGONAL, KEYS_AS_ROWS, E, PRECISION)
        dct = dc.to(q_hi.dtype)
        if not KEYS_AS_ROWS:
            dct = tl.trans(dct)
        u_hi = tl.dot(dct, q_hi, u_hi, input_precision=PRECISION)
        if QB > 0:
            u_lo = tl.dot(dct, q_lo, u_lo, input_precision=PRECISION)
    return dv, u_hi, u_lo


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def conv_dkdv_kernel(Q, KF, V, DO, LSE, DELTA, CD, U, DV,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                     stride_dob, stride_doh, stride_dom, stride_dod,
                     stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                     n_q, n_k, num_kv_heads, group_size, scale, N_BUCKET,
                     CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                     E_PAD: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, D: tl.constexpr,
                     BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, KEYS_AS_ROWS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dV`` and ``U[b, h, a, j] = sum_i dC_far[i, j] q[i - (cq-1) + a]`` (fp32, contiguous
    ``[B, Hq, CQ, n, D]``, per query head) for ``BLOCK_N`` keys of one kv head; the program loops over the
    ``group_size`` query heads that read it (``dV`` sums over them). ``KEYS_AS_ROWS``: the score tiles are made
    transposed (:func:`_dkdv_query_tiles`; it pays on Hopper with 128 owned keys over 8 warps).

    Grid: ``(cdiv(n, BLOCK_N), B * Hkv)``, heaviest (first) key tiles first (:mod:`mta.launch_order`).
    """
    n = n_q
    pid_n, pid_bkv, b, kv_h, _ = program_coordinates(num_kv_heads, 1, HEAVY_LAST=False)
    n0 = pid_n * BLOCK_N
    offs_k = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    vt = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_k[None, :] * stride_vn + offs_d[:, None] * stride_vd,
                 mask=d_ok[:, None] & (offs_k < n)[None, :], other=0.0)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E
    # Rows before n0 see none of these keys; rows from m_full on are at least E past every one of them
    # (no diagonal to put in, no mask); the rows between are the diagonal tiles.
    start, m_full = query_tile_bounds(n0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    for g in range(0, group_size):
        h = kv_h * group_size + g
        bh = b * num_kv_heads * group_size + h
        kf_base = KF + b * stride_kfb + h * stride_kfh
        kf_hi = folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, 0, QA, CQ, D, BLOCK_D)
        if QB > 0:
            kf_lo = folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, QA, QB, CQ, D, BLOCK_D)
        else:
            kf_lo = kf_hi
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        u_hi = tl.zeros([BLOCK_N, QA * BLOCK_D], dtype=tl.float32)
        if QB > 0:
            u_lo = tl.zeros([BLOCK_N, QB * BLOCK_D], dtype=tl.float32)
        else:
            u_lo = u_hi  # unused
        # The diagonal tiles, then the rows past them (no mask when causal; key tail masked when not).
        dv, u_hi, u_lo = _dkdv_query_tiles(dv, u_hi, u_lo, kf_hi, kf_lo, vt, q_base, do_base, LSE + bh * n,
                                           DELTA + bh * n, CD + bh * n * E_PAD, stride_qm, stride_qd, stride_dom,
                                           stride_dod, offs_k, offs_d, start, m_full, n, qk_scale, CAUSAL, False, CQ,
                                           QA, QB, E, E_PAD, D, BLOCK_D, BLOCK_M, PRECISION, KEYS_AS_ROWS)
        dv, u_hi, u_lo = _dkdv_query_tiles(dv, u_hi, u_lo, kf_hi, kf_lo, vt, q_base, do_base, LSE + bh * n,
                                           DELTA + bh * n, CD + bh * n * E_PAD, stride_qm, stride_qd, stride_dom,
                                           stride_dod, offs_k, offs_d, m_full, n, n, qk_scale, False, not CAUSAL, CQ,
                                           QA, QB, E, E_PAD, D, BLOCK_D, BLOCK_M, PRECISION, KEYS_AS_ROWS)
        u_base = U + bh * CQ * n * D
        _store_shifts(u_base, n * D, D, u_hi, offs_k, n, 0, QA, CQ, D, BLOCK_D)
        if QB > 0:
            _store_shifts(u_base, n * D, D, u_lo, offs_k, n, QA, QB, CQ, D, BLOCK_D)
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_k[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=(offs_k < n)[:, None] & d_ok[None, :])


@triton.jit
def _near_dc(cd_base, pv_base, lse_base, delta_base, rows, n, qk_scale, E: tl.constexpr, E_PAD: tl.constexpr):
    """``DC [ROWS, E_PAD]``: ``dC[i, i - delta]`` for the rows ``i`` and the ``E`` masked diagonals ``delta``;
    zero for rows outside ``[0, n)``, keys before 0 and ``delta >= E``.

    ``P[i, i - delta] = exp(scale * CD[i, delta] - lse_i)`` from the forward's diagonal scores and
    ``dP[i, i - delta] = dO_i . v_{i - delta}`` from the past products ``PV`` (rows ``E_PAD`` wide)."""
    delta = tl.arange(0, E_PAD)[None, :]
    row_ok = (rows >= 0) & (rows < n)
    ok = row_ok[:, None] & (delta < E) & (rows[:, None] - delta >= 0)
    cd = tl.load(cd_base + rows[:, None] * E_PAD + delta, mask=ok, other=0.0)
    pv = tl.load(pv_base + rows[:, None] * E_PAD + delta, mask=ok, other=0.0)
    lse2 = tl.load(lse_base + rows, mask=row_ok, other=0.0) * LOG2E
    dl = tl.load(delta_base + rows, mask=row_ok, other=0.0)
    p = tl.math.exp2(tl.where(ok, cd * qk_scale - lse2[:, None], float("-inf")))
    return p * (pv - dl[:, None])


@triton.jit(do_not_specialize=["n"])
def conv_near_kernel(CD, PV, PQ, LSE, DELTA, W, G, DWP, n, num_heads, scale,
                     CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
                     EP_PAD: tl.constexpr, BLOCK_R: tl.constexpr):
    """The masked diagonals' share (causal, ``E > 0``), for ``BLOCK_R`` rows of one head:

    * ``G[b, h, r, e] = sum_a sum_delta DC[r + (cq-1) - a, delta] W[a, a - e + delta + pk - (cq-1)]`` (fp32,
      contiguous ``[B, Hq, n, EP_PAD]``): the gradient of the past score ``S[r, r - e]``, ``e <= E'``, over
      ``scale``; one small product per kernel row, the transpose of :func:`mta.conv_forward.diagonal_scores_kernel`.
    * ``DWP[tile, b, h, a, b'] = sum_{i in tile} sum_delta DC[i, delta] PQ[i - (cq-1) + a, e]`` with
      ``e = delta - (cq-1) + a + pk - b'``: the kernel's gradient from these diagonals, over ``scale``, where
      ``PQ[r, e] = q_r . k_{r-e}`` are the past scores (0 past ``E'``, so future scores never enter).

    ``CD``, ``PV`` (``dO_i . v_{i-delta}``): contiguous ``[B, Hq, n, E_PAD]``; ``PQ``: ``[B, Hq, n, EP_PAD]``.
    Grid: ``(cdiv(n, BLOCK_R), B * Hq)``.
    """
    PK: tl.constexpr = (CK - 1) // 2
    tile = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_r = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    cd_base = CD + pid_bh * n * E_PAD
    pv_base = PV + pid_bh * n * E_PAD
    lse_base = LSE + pid_bh * n
    delta_base = DELTA + pid_bh * n
    pq_base = PQ + pid_bh * n * EP_PAD
    w_base = W + h * CQ * CK
    qk_scale = scale * LOG2E
    delta = tl.arange(0, E_PAD)
    e = tl.arange(0, EP_PAD)
    g = tl.zeros([BLOCK_R, EP_PAD], dtype=tl.float32)
    for a in range(CQ):
        dc_a = _near_dc(cd_base, pv_base, lse_base, delta_base, offs_r + (CQ - 1) - a, n, qk_scale, E, E_PAD)
        wb = a - e[None, :] + delta[:, None] + PK - (CQ - 1)  # [E_PAD, EP_PAD]: the kernel column pairing them
        w_a = tl.load(w_base + a * CK + wb, mask=(wb >= 0) & (wb < CK) & (delta < E)[:, None], other=0.0)
        g = tl.dot(dc_a, w_a, g, input_precision="ieee")
    tl.store(G + pid_bh * n * EP_PAD + offs_r[:, None] * EP_PAD + e[None, :], g, mask=(offs_r < n)[:, None])

    dc = tl.trans(_near_dc(cd_base, pv_base, lse_base, delta_base, offs_r, n, qk_scale, E, E_PAD))
    dwp_base = DWP + (tile * tl.num_programs(1) + pid_bh) * CQ * CK
    shift = delta[:, None] - e[None, :]  # b' = shift - (cq-1) + a + pk
    for a in range(CQ):
        rows = offs_r - (CQ - 1) + a
        pq = tl.load(pq_base + rows[:, None] * EP_PAD + e[None, :], mask=((rows >= 0) & (rows < n))[:, None],
                     other=0.0)
        m = tl.dot(dc, pq, input_precision="ieee")  # [E_PAD, EP_PAD]: sum over the tile's rows
        for t in tl.static_range(CK):
            tl.store(dwp_base + a * CK + t, tl.sum(tl.sum(tl.where(shift == t + (CQ - 1) - a - PK, m, 0.0), 1), 0))


@triton.jit
def _shifted_rows(CUR, PREV, bh_cur, bh_prev, stride_a, stride_n, a, rows, wanted, offs_d, n, cur0, prev0,
                  HAS_PREV: tl.constexpr, D: tl.constexpr):
    """``X_a[rows]`` (fp32 ``[ROWS, BLOCK_D]``, 0 outside ``[0, n)`` and where not ``wanted``) of a buffer
    ``X[bh, a, row, d]`` whose rows from ``cur0`` are in ``CUR`` (at ``bh_cur + a * stride_a + (row - cur0) *
    stride_n + d``) and, ``HAS_PREV``, the rows from ``prev0`` to ``cur0`` in ``PREV`` (the previous chunk's
    buffer, laid out alike but for ``bh_prev``). Only the ``wanted`` rows are read: the others may lie past a
    chunk's buffer."""
    ok = (wanted & (rows < n))[:, None] & (offs_d < D)[None, :]
    in_cur = (rows >= cur0)[:, None]
    x = tl.load(CUR + bh_cur + a * stride_a + (rows - cur0)[:, None] * stride_n + offs_d[None, :],
                mask=ok & in_cur, other=0.0).to(tl.float32)
    if HAS_PREV:
        x += tl.load(PREV + bh_prev + a * stride_a + (rows - prev0)[:, None] * stride_n + offs_d[None, :],
                     mask=ok & (rows >= prev0)[:, None] & ~in_cur, other=0.0).to(tl.float32)
    return x


@triton.jit(do_not_specialize=["n", "cur0", "cur1", "f0", "f1"])
def conv_dq_fold_kernel(GQ, G, K, DQ, DQ_OUT, stride_gb, stride_ga, stride_gn,
                        stride_kb, stride_kh, stride_kn, stride_kd,
                        stride_dqb, stride_dqh, stride_dqm, stride_dqd, n, cur0, cur1, f0, f1, num_heads,
                        group_size, scale, NEAR: tl.constexpr, ACCUMULATE: tl.constexpr, CQ: tl.constexpr,
                        EP: tl.constexpr, EP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_R: tl.constexpr):
    """``dq[r] = scale * (sum_a Gq_a[r + (cq-1) - a] + sum_{e <= EP} G[r, e] k[r - e])`` (the second sum
    when ``NEAR``), in dq's dtype, for the rows ``[f0, f1)``. ``Gq_a[b * Hq + h, row, d]`` at
    ``GQ + bh * stride_gb + a * stride_ga + (row - cur0) * stride_gn + d`` for rows ``[cur0, cur1)`` (the one-pass
    backward: contiguous ``[B, Hq, CQ, n, D]``, ``cur0 = 0``, ``cur1 = n``; the two-phase one: a block of rows
    ``[B * Hq, rows, CQ * D]`` of one chunk of keys' part of ``Gq``), 0 outside them. ``ACCUMULATE``: ``DQ`` is an
    fp32 running sum of the parts of ``dq`` (the two-phase backward: one part per chunk of keys), which this part
    is added to, the sum stored to ``DQ_OUT`` (``DQ`` itself, or the finished ``dq`` in its dtype, laid out alike).
    Else the part is stored to ``DQ``. ``G``: ``[B, Hq, n, EP_PAD]``. Grid: ``(cdiv(f1 - f0, BLOCK_R), B * Hq)``."""
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_r = f0 + tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = offs_r < f1
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    dq = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for a in range(CQ):
        rows = offs_r + (CQ - 1) - a
        dq += _shifted_rows(GQ, GQ, pid_bh * stride_gb, 0, stride_ga, stride_gn, a, rows, r_ok & (rows < cur1),
                            offs_d, n, cur0, 0, False, D)
    if NEAR:
        k_base = K + b * stride_kb + (h // group_size) * stride_kh
        g_base = G + pid_bh * n * EP_PAD
        for e in range(EP + 1):
            keys = offs_r - e
            g = tl.load(g_base + offs_r * EP_PAD + e, mask=r_ok, other=0.0)
            k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                        mask=((keys >= 0) & (keys < n))[:, None] & d_ok[None, :], other=0.0)
            dq += g[:, None] * k.to(tl.float32)
    offs = b * stride_dqb + h * stride_dqh + offs_r[:, None] * stride_dqm + offs_d[None, :] * stride_dqd
    dq_ptrs = DQ + offs
    if ACCUMULATE:
        dq = dq * scale + tl.load(dq_ptrs, mask=r_ok[:, None] & d_ok[None, :], other=0.0)
        tl.store(DQ_OUT + offs, dq.to(DQ_OUT.dtype.element_ty), mask=r_ok[:, None] & d_ok[None, :])
    else:
        tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=r_ok[:, None] & d_ok[None, :])


@triton.jit
def _batch_and_kv_head(num_kv_heads):
    """``(b, kv_h)`` of a dK fold's program in its ``(tiles, B * Hkv)`` grid, int64: the offsets of a program's batch
    and head stay exact past 2**31 elements."""
    pid_bkv = tl.program_id(1).to(tl.int64)
    return pid_bkv // num_kv_heads, pid_bkv % num_kv_heads


@triton.jit(do_not_specialize=["n", "cur0", "prev0", "f0", "f1"])
def conv_dk_fold_kernel(U, U_PREV, G, Q, K, W, DK, DWP, stride_ub, stride_ua, stride_un, stride_pb,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_kb, stride_kh, stride_kn, stride_kd, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                        n, cur0, prev0, f0, f1, num_kv_heads, group_size, scale, NEAR: tl.constexpr,
                        HAS_PREV: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, CK_PAD: tl.constexpr,
                        EP: tl.constexpr, EP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_R: tl.constexpr):
    """``dk[c] = scale * sum_{h in group} (sum_{a, b} W[h, a, b] U_{h,a}[c + pk - b] + sum_{e <= EP} G_h[c + e, e] q_h[c + e])``
    (the second sum when ``NEAR``), in dk's dtype, for the keys ``[f0, f1)``, and the kernel's gradient from the
    far part, over ``scale``: ``DWP[tile, b, h, a, b] = sum_{c in tile} <U_{h,a}[c + pk - b], k[c]>`` (the same
    shifted tiles of ``U``).

    ``U_a[b * Hq + h, row, d]`` at ``U + bh * stride_ub + a * stride_ua + (row - cur0) * stride_un + d`` for rows
    from ``cur0`` (the one-pass backward: contiguous ``[B, Hq, CQ, n, D]``, ``cur0 = 0``; the two-phase one: a
    chunk of keys ``[B * Hq, keys, CQ * D]``) and, ``HAS_PREV``, in ``U_PREV`` (bh stride ``stride_pb``) from
    ``prev0``: the previous chunk. ``G``: ``[B, Hq, n, EP_PAD]``; ``W``: ``[Hq, CQ, CK]`` fp32.
    Grid: ``(cdiv(f1 - f0, BLOCK_R), B * Hkv)``. Memory-bound, like :func:`mta.conv_forward.fold_keys_kernel`.
    The ``DWP`` partials of kernel row ``a`` sit per row in a ``[BLOCK_R, CK_PAD]`` tile, one column per kernel
    column, and are summed over the rows once per ``a``: a sum across warps per ``(a, b)`` is a barrier each.
    """
    PK: tl.constexpr = (CK - 1) // 2
    tile = tl.program_id(0)
    b, kv_h = _batch_and_kv_head(num_kv_heads)
    num_heads = num_kv_heads * group_size
    offs_c = f0 + tile * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    c_ok = offs_c < f1
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + offs_c[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=c_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    dk = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    cols = tl.arange(0, CK_PAD)
    for g in range(0, group_size):
        h = kv_h * group_size + g
        bh = b * num_heads + h
        dwp_base = DWP + (tile * tl.num_programs(1) * group_size + bh) * CQ * CK
        for a in range(CQ):
            dw_rows = tl.zeros([BLOCK_R, CK_PAD], dtype=tl.float32)  # column t: <U_a[c + pk - t], k[c]> per row c
            for t in tl.static_range(CK):
                rows = offs_c + PK - t
                u = _shifted_rows(U, U_PREV, bh * stride_ub, bh * stride_pb, stride_ua, stride_un, a, rows, c_ok,
                                  offs_d, n, cur0, prev0, HAS_PREV, D)  # rows before 0 are before cur0, prev0
                dk += tl.load(W + (h * CQ + a) * CK + t) * u
                dw_rows += tl.where(cols[None, :] == t, tl.sum(u * k, 1)[:, None], 0.0)
            tl.store(dwp_base + a * CK + cols, tl.sum(dw_rows, 0), mask=cols < CK)
        if NEAR:
            q_base = Q + b * stride_qb + h * stride_qh
            g_base = G + bh * n * EP_PAD
            for e in range(EP + 1):
                rows = offs_c + e
                r_ok = rows < n
                gv = tl.load(g_base + rows * EP_PAD + e, mask=r_ok, other=0.0)
                q = tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                            mask=r_ok[:, None] & d_ok[None, :], other=0.0)
                dk += gv[:, None] * q.to(tl.float32)
    tl.store(DK + b * stride_dkb + kv_h * stride_dkh + offs_c[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk * scale).to(DK.dtype.element_ty), mask=c_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["n", "cur0", "prev0", "f0", "f1"])
def conv_dk_fold_product_kernel(U, U_PREV, G, Q, K, W, DK, DWP, stride_ub, stride_ua, stride_un, stride_pb,
                                stride_qb, stride_qh, stride_qm, stride_qd,
                                stride_kb, stride_kh, stride_kn, stride_kd,
                                stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                                n, cur0, prev0, f0, f1, num_kv_heads, group_size, scale, NEAR: tl.constexpr,
                                HAS_PREV: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, CK_PAD: tl.constexpr,
                                EP: tl.constexpr, EP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                                BLOCK_R: tl.constexpr, WINDOW: tl.constexpr, NEAR_WINDOW: tl.constexpr):
    """:func:`conv_dk_fold_kernel`'s ``dk`` and ``DWP`` from 16-bit ``U`` by products on the tensor cores: the
    ``WINDOW >= BLOCK_R + ck - 1`` rows of ``U_a`` that the tile's keys read are loaded once per ``(h, a)``
    (the pointer kernel loads ``ck`` shifted tiles), and

        dk_tile += B_a U_window,   B_a[i, m] = W[h, a, t],  t = i + 2 pk - m  (0 <= t < ck)
        M_a = k_tile U_window^T,   DWP[.., a, t] = sum_i M_a[i, i + 2 pk - t]  (a diagonal sum: tl.gather)
        dk_tile += G_band q_window, G_band[i, m] = G[c0 + m, m - i]  (0 <= m - i <= E', ``NEAR``)

    over ``NEAR_WINDOW >= BLOCK_R + E'`` rows of q. The fp32 ``B_a`` and ``G_band`` go in as their 16-bit part
    and the 16-bit rest (two products with exact 16-bit multiplies and fp32 sums: W and G kept to ``2^-16`` in
    bf16); ``M_a``'s inputs are 16-bit already (exact). Arguments and grid as :func:`conv_dk_fold_kernel`'s."""
    PK: tl.constexpr = (CK - 1) // 2
    tile = tl.program_id(0)
    b, kv_h = _batch_and_kv_head(num_kv_heads)
    num_heads = num_kv_heads * group_size
    c0 = f0 + tile * BLOCK_R
    offs_i = tl.arange(0, BLOCK_R)
    offs_c = c0 + offs_i
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    c_ok = offs_c < f1
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + offs_c[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=c_ok[:, None] & d_ok[None, :], other=0.0).to(U.dtype.element_ty)
    # U's window: key c0 + i reads row c0 + i + pk - t = c0 - pk + m; rows no valid key reads stay 0 (they may
    # lie past the chunk's buffer).
    offs_m = tl.arange(0, WINDOW)
    rows = c0 - PK + offs_m
    t = offs_i[:, None] + 2 * PK - offs_m[None, :]  # the kernel column of window row m for key i
    in_band = (t >= 0) & (t < CK) & c_ok[:, None]
    cols = tl.arange(0, CK_PAD)
    diagonal = tl.maximum(offs_i[:, None] + 2 * PK - cols[None, :], 0)  # [BLOCK_R, CK_PAD]: M_a's column of t
    dk = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for g in range(0, group_size):
        h = kv_h * group_size + g
        bh = b * num_heads + h
        dwp_base = DWP + (tile * tl.num_programs(1) * group_size + bh) * CQ * CK
        for a in tl.range(0, CQ, num_stages=1):
            window = _shifted_rows(U, U_PREV, bh * stride_ub, bh * stride_pb, stride_ua, stride_un, a, rows,
                                   rows < f1 + PK, offs_d, n, cur0, prev0, HAS_PREV, D).to(U.dtype.element_ty)
            band = tl.load(W + (h * CQ + a) * CK + t, mask=in_band, other=0.0)
            dk = split_product(band, window, dk)
            m_a = tl.dot(k, tl.trans(window))  # [BLOCK_R, WINDOW]: <k[c0 + i], U_a[c0 - pk + m]>
            dw = tl.sum(tl.where(cols[None, :] < CK, tl.gather(m_a, diagonal, 1), 0.0), 0)
            tl.store(dwp_base + a * CK + cols, dw, mask=cols < CK)
        if NEAR:
            offs_w = tl.arange(0, NEAR_WINDOW)
            q_rows = c0 + offs_w
            e = offs_w[None, :] - offs_i[:, None]  # the diagonal of G that q row c0 + m is on for key i
            g_band = tl.load(G + bh * n * EP_PAD + q_rows[None, :] * EP_PAD + e,
                             mask=(e >= 0) & (e <= EP) & (q_rows < n)[None, :] & c_ok[:, None], other=0.0)
            q_window = tl.load(Q + b * stride_qb + h * stride_qh + q_rows[:, None] * stride_qm
                               + offs_d[None, :] * stride_qd, mask=(q_rows < n)[:, None] & d_ok[None, :],
                               other=0.0).to(U.dtype.element_ty)
            dk = split_product(g_band, q_window, dk)
    tl.store(DK + b * stride_dkb + kv_h * stride_dkh + offs_c[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk * scale).to(DK.dtype.element_ty), mask=c_ok[:, None] & d_ok[None, :])


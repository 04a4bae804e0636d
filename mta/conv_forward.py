"""MTA forward in Triton: the key-query convolution fused into flash attention.

``C[i, j] = sum_{a, b} w[a, b] * S0[i - (cq-1) + a, j - pk + b]`` with
``pk = (ck-1)/2``, ``S = scale * Q K^T`` and ``S0`` its causal version (future
zeroed *before* the convolution). One program owns ``BLOCK_M`` query rows, as
in chapter 03, and walks the key tiles with the online softmax. What changes
is how a tile of ``C`` is made, in two stages:

* **Folded tiles** (left of the diagonal band, and every tile when not causal):
  no pre-convolution mask touches them, so ``S0 = S`` and the key axis of the
  convolution folds into the keys,

      C[i, j] = scale * sum_a q_{i-(cq-1)+a} . Kf_a[j],    Kf_a[j] = sum_b w[a, b] k_{j-pk+b},

  with ``Kf`` precomputed once per query head (``cq`` weighted, shifted copies
  of K; O(N) memory). Queries are shifted by loading rows ``i-(cq-1)+a`` (the
  halo of the seed's algorithm, read straight from memory). The program loads
  its ``cq`` shifted query tiles once, side by side, and holds them for the
  whole key walk, so a tile of C is one product of depth ``cq * D`` (two, as
  Triton's shapes are powers of two) against streamed folded keys. When they do
  not fit in shared memory, they are reloaded per key tile instead.
* **Band tiles** (within ``cq - 1 + pk`` of the diagonal, ``BAND_N`` keys wide):
  the pre-mask zeroes some of the terms, so the scores are recomputed on a halo
  tile of ``BLOCK_W = 2 * BAND_N >= BAND_N + ck - 1`` keys, masked, and convolved along the key
  axis by a product with a banded (Toeplitz) matrix ``T_a[u, c] = w[a, u - c]``
  on the tensor cores; the query axis is again a sum over shifted query loads.

Key tiles right of the diagonal are never loaded.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import tuning


@triton.jit
def _attend_tile(acc, m, l, c, v_base, stride_vn, stride_vd, offs_k, offs_d, n,
                 MASKED: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr):
    """Fold a tile of convolved scores ``c`` (base-2 units) for keys ``offs_k`` and their values into
    the state ``(acc, m, l)``. ``MASKED``: the tile may hold keys ``>= n`` or ``-inf`` entries."""
    k_ok = offs_k < n
    if MASKED:
        c = tl.where(k_ok[None, :], c, float("-inf"))
    v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=k_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    m_new = tl.maximum(m, tl.max(c, 1))
    if MASKED:  # a row that has seen only masked keys keeps m = -inf; subtract 0 instead
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(c - m_new_safe[:, None])
    alpha = tl.math.exp2(m - m_new_safe)
    l = l * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_new, l


@triton.jit
def _shifted_query_tile(q_base, stride_qm, stride_qd, offs_m, offs_d, n, a, CQ: tl.constexpr, D: tl.constexpr):
    """``(q[i - (cq-1) + a] for the tile's rows i, those row indices)``; rows outside ``[0, n)`` load 0."""
    rows = offs_m - (CQ - 1) + a
    q_a = tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                  mask=((rows >= 0) & (rows < n))[:, None] & (offs_d < D)[None, :], other=0.0)
    return q_a, rows


@triton.jit
def _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, A0: tl.constexpr, NA: tl.constexpr,
                     CQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """``[BLOCK_M, NA * BLOCK_D]``: column ``a' * BLOCK_D + d`` holds ``q[i - (cq-1) + A0 + a', d]``.

    ``NA`` query shifts side by side, so one product of depth ``NA * BLOCK_D``
    against the matching folded keys sums ``NA`` terms of the convolution.
    Rows outside ``[0, n)`` (the zero padding) and shifts ``a >= cq`` load 0.
    """
    cols = tl.arange(0, NA * BLOCK_D)
    a = A0 + cols // BLOCK_D
    d = cols % BLOCK_D
    rows = offs_m[:, None] - (CQ - 1) + a[None, :]
    ok = (rows >= 0) & (rows < n) & ((a < CQ) & (d < D))[None, :]
    return tl.load(q_base + rows * stride_qm + d[None, :] * stride_qd, mask=ok, other=0.0)


@triton.jit
def _folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, A0: tl.constexpr, NA: tl.constexpr,
                 CQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """``[NA * BLOCK_D, BLOCK_N]``: row ``a' * BLOCK_D + d`` holds ``Kf_{A0 + a'}[j, d]``, the match of :func:`_shifted_queries`."""
    rows = tl.arange(0, NA * BLOCK_D)
    a = A0 + rows // BLOCK_D
    d = rows % BLOCK_D
    ok = ((a < CQ) & (d < D))[:, None] & (offs_k < n)[None, :]
    return tl.load(kf_base + a[:, None] * stride_kfa + d[:, None] * stride_kfd + offs_k[None, :] * stride_kfn,
                   mask=ok, other=0.0)


@triton.jit
def _resident_folded_tiles(acc, m, l, q_hi, q_lo, kf_base, v_base, stride_kfa, stride_kfn, stride_kfd,
                           stride_vn, stride_vd, offs_d, start, stop, n, qk_scale,
                           MASKED: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr,
                           D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Folded key tiles with the shifted queries held for the whole walk (``q_hi``: shifts ``[0, QA)``,
    ``q_lo``: ``[QA, QA + QB)``). A tile of C is one or two products of depth ``QA * BLOCK_D`` and
    ``QB * BLOCK_D``: each key tile only streams its folded keys and values in."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        offs_k = start_n + offs_n
        kf_hi = _folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, 0, QA, CQ, D, BLOCK_D)
        c = tl.dot(q_hi, kf_hi, input_precision=PRECISION)
        if QB > 0:
            kf_lo = _folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, QA, QB, CQ, D, BLOCK_D)
            c = tl.dot(q_lo, kf_lo, c, input_precision=PRECISION)
        acc, m, l = _attend_tile(acc, m, l, c * qk_scale, v_base, stride_vn, stride_vd, offs_k, offs_d, n,
                                 MASKED, D, PRECISION)
    return acc, m, l


@triton.jit
def _streamed_folded_tiles(acc, m, l, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                  stride_vn, stride_vd, offs_m, offs_d, start, stop, n, qk_scale,
                  MASKED: tl.constexpr, CQ: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr):
    """Folded key tiles when the shifted queries are too big to hold: ``cq`` products of depth ``D``
    per tile, each shifted query tile loaded again (from L2) for every key tile."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    for start_n in range(start, stop, BLOCK_N):
        offs_k = start_n + offs_n
        k_ok = offs_k < n
        c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for a in range(CQ):  # a run-time loop: one shifted tile live at a time (shared memory)
            q_a, _ = _shifted_query_tile(q_base, stride_qm, stride_qd, offs_m, offs_d, n, a, CQ, D)
            kf_t = tl.load(kf_base + a * stride_kfa + offs_k[None, :] * stride_kfn + offs_d[:, None] * stride_kfd,
                           mask=d_ok[:, None] & k_ok[None, :], other=0.0)
            c = tl.dot(q_a, kf_t, c, input_precision=PRECISION)
        acc, m, l = _attend_tile(acc, m, l, c * qk_scale, v_base, stride_vn, stride_vd, offs_k, offs_d, n,
                                 MASKED, D, PRECISION)
    return acc, m, l


@triton.jit
def _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa, stride_kfn,
                  stride_kfd, stride_vn, stride_vd, offs_m, offs_d, start, stop, n, qk_scale,
                  MASKED: tl.constexpr, RESIDENT: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr,
                  QB: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Key tiles ``[start, stop)`` whose scores need no pre-convolution mask. ``MASKED``: the key tail ``j >= n``."""
    if RESIDENT:
        acc, m, l = _resident_folded_tiles(acc, m, l, q_hi, q_lo, kf_base, v_base, stride_kfa, stride_kfn,
                                           stride_kfd, stride_vn, stride_vd, offs_d, start, stop, n, qk_scale,
                                           MASKED, CQ, QA, QB, D, BLOCK_D, BLOCK_N, PRECISION)
    else:
        acc, m, l = _streamed_folded_tiles(acc, m, l, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa,
                                           stride_kfn, stride_kfd, stride_vn, stride_vd, offs_m, offs_d, start,
                                           stop, n, qk_scale, MASKED, CQ, D, BLOCK_M, BLOCK_N, PRECISION)
    return acc, m, l


@triton.jit
def _band_tiles(acc, m, l, q_base, k_base, v_base, w_base, stride_qm, stride_qd, stride_kn, stride_kd,
                stride_vn, stride_vd, offs_m, offs_d, start, stop, n, qk_scale,
                CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_W: tl.constexpr, PRECISION: tl.constexpr, CONV_PRECISION: tl.constexpr):
    """Causal key tiles ``[start, stop)`` near the diagonal: halo scores, pre-mask, Toeplitz convolution, post-mask."""
    PK: tl.constexpr = (CK - 1) // 2
    offs_n = tl.arange(0, BLOCK_N)
    offs_w = tl.arange(0, BLOCK_W)
    d_ok = offs_d < D
    shift = offs_w[:, None] - offs_n[None, :]  # T[u, c] = w[u - c] for 0 <= u - c < ck
    in_band = (shift >= 0) & (shift < CK)
    for start_n in range(start, stop, BLOCK_N):
        halo = start_n - PK + offs_w  # keys j - pk .. j + pk of the tile's columns
        halo_ok = (halo >= 0) & (halo < n)
        kh_t = tl.load(k_base + halo[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                       mask=d_ok[:, None] & halo_ok[None, :], other=0.0)  # K^T halo [BLOCK_D, BLOCK_W]
        c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for a in range(CQ):  # a run-time loop: one shifted tile live at a time (shared memory)
            q_a, rows = _shifted_query_tile(q_base, stride_qm, stride_qd, offs_m, offs_d, n, a, CQ, D)
            s0 = tl.dot(q_a, kh_t, input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_W]
            s0 = tl.where(halo[None, :] <= rows[:, None], s0, 0.0)  # zero the future before the convolution
            t_a = tl.load(w_base + a * CK + shift, mask=in_band, other=0.0)  # [BLOCK_W, BLOCK_N], fp32
            c = tl.dot(s0, t_a, c, input_precision=CONV_PRECISION)
        offs_k = start_n + offs_n
        c = tl.where(offs_k[None, :] <= offs_m[:, None], c, float("-inf"))  # and mask it after
        acc, m, l = _attend_tile(acc, m, l, c, v_base, stride_vn, stride_vd, offs_k, offs_d, n, True, D, PRECISION)
    return acc, m, l


@triton.jit(do_not_specialize=["n"])
def fold_keys_kernel(K, W, KF, stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_fb, stride_fh, stride_fa, stride_fn, stride_fd,
                     n, num_heads, group_size, CQ: tl.constexpr, CK: tl.constexpr,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """``KF[b, h, a, j] = sum_t W[h, a, t] * K[b, h // G, j - pk + t]``, zero outside ``[0, n)``.

    Grid: ``(cdiv(n, BLOCK_N), CQ, B * Hq)``, one row ``a`` of the kernel per
    program. Memory-bound: the ``ck`` shifted reads of K mostly hit the cache,
    each folded row is written once.
    """
    PK: tl.constexpr = (CK - 1) // 2
    a = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    k_base = K + b * stride_kb + (h // group_size) * stride_kh
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for t in tl.static_range(CK):
        rows = offs_n - PK + t
        k = tl.load(k_base + rows[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=((rows >= 0) & (rows < n))[:, None] & d_ok[None, :], other=0.0)
        acc += tl.load(W + (h * CQ + a) * CK + t) * k.to(tl.float32)
    tl.store(KF + b * stride_fb + h * stride_fh + a * stride_fa + offs_n[:, None] * stride_fn
             + offs_d[None, :] * stride_fd, acc.to(KF.dtype.element_ty), mask=(offs_n < n)[:, None] & d_ok[None, :])


@triton.autotune(configs=tuning.conv_forward_configs(), key=["N_BUCKET", "BLOCK_D", "CAUSAL", "CQ", "CK"])
@triton.heuristics(tuning.conv_forward_heuristics())
@triton.jit(do_not_specialize=tuning.NO_SPECIALIZE)
def conv_forward_kernel(Q, K, V, KF, W, O, LSE,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_kb, stride_kh, stride_kn, stride_kd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                        stride_ob, stride_oh, stride_om, stride_od,
                        n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                        CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr,
                        D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                        CONV_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        QA: tl.constexpr, QB: tl.constexpr, RESIDENT: tl.constexpr, BAND_N: tl.constexpr):
    """``O = softmax(conv(S0, W)) V`` and ``LSE`` (natural log, fp32, ``[B * Hq, n]``), ``n = n_q = n_k``.

    ``KF [B, Hq, CQ, n, D]`` holds the folded keys; ``W [Hq, CQ, CK]`` fp32.
    ``QA + QB >= CQ``: the query shifts in two power-of-two groups (``QB = 0``: one);
    ``RESIDENT``: hold them, shifted, for the whole key walk (they fit in shared memory).
    ``BAND_N <= BLOCK_N`` (a divisor): the narrower key tiles of the band, which cost more per key.
    Grid: ``(cdiv(n, BLOCK_M), B * Hq)``.
    """
    BLOCK_W: tl.constexpr = 2 * BAND_N  # the band's halo tile: BAND_N + ck - 1 keys fit when ck <= BAND_N + 1
    PK: tl.constexpr = (CK - 1) // 2
    n = n_q
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    kv_h = h // group_size
    i0 = tl.program_id(0) * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    kf_base = KF + b * stride_kfb + h * stride_kfh

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # the convolution is linear: convolve in base-2 units
    if RESIDENT:  # the cq shifted query tiles, side by side, loaded once
        q_hi = _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, 0, QA, CQ, D, BLOCK_D)
        if QB > 0:
            q_lo = _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, QA, QB, CQ, D, BLOCK_D)
        else:
            q_lo = q_hi
    else:
        q_hi = 0.0
        q_lo = 0.0

    if CAUSAL:
        # Key j needs no pre-mask for any row of the block when i0 - j >= cq - 1 + pk,
        # i.e. j < i0 - CQ - PK + 2: the safe keys, walked in folded tiles.
        safe_stop = tl.maximum(i0 - CQ - PK + 2, 0)
        fold_stop = safe_stop // BLOCK_N * BLOCK_N
        acc, m, l = _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd,
                                  stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, offs_m, offs_d,
                                  0, fold_stop, n, qk_scale, False, RESIDENT, CQ, QA, QB, D, BLOCK_D,
                                  BLOCK_M, BLOCK_N, PRECISION)
        if BAND_N < BLOCK_N:  # the rest of the safe keys in narrow folded tiles: cheaper than band tiles
            band_start = safe_stop // BAND_N * BAND_N
            acc, m, l = _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd,
                                      stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, offs_m, offs_d,
                                      fold_stop, band_start, n, qk_scale, False, RESIDENT, CQ, QA, QB, D, BLOCK_D,
                                      BLOCK_M, BAND_N, PRECISION)
        else:
            band_start = fold_stop
        band_stop = tl.minimum(i0 + BLOCK_M, n)
        acc, m, l = _band_tiles(acc, m, l, q_base, k_base, v_base, W + h * CQ * CK, stride_qm, stride_qd,
                                stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, band_start, band_stop,
                                n, qk_scale, CQ, CK, D, BLOCK_M, BAND_N, BLOCK_W, PRECISION, CONV_PRECISION)
    else:
        full_stop = n // BLOCK_N * BLOCK_N
        acc, m, l = _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd,
                                  stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, offs_m, offs_d,
                                  0, full_stop, n, qk_scale, False, RESIDENT, CQ, QA, QB, D, BLOCK_D,
                                  BLOCK_M, BLOCK_N, PRECISION)
        acc, m, l = _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd,
                                  stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, offs_m, offs_d,
                                  full_stop, n, n, qk_scale, True, RESIDENT, CQ, QA, QB, D, BLOCK_D,
                                  BLOCK_M, BLOCK_N, PRECISION)

    row_ok = offs_m < n
    d_ok = offs_d < D
    o = acc / l[:, None]  # every row sees at least its own key: l > 0
    lse = (m + tl.math.log2(l)) * 0.6931471805599453
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * n + offs_m, lse, mask=row_ok)

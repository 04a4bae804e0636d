"""MTA forward in Triton: the key-query convolution fused into flash attention.

``C[i, j] = sum_{a, b} w[a, b] * S0[i - (cq-1) + a, j - pk + b]`` with
``pk = (ck-1)/2``, ``S = scale * Q K^T`` and ``S0`` its causal version (future
zeroed *before* the convolution). One program owns ``BLOCK_M`` query rows, as
in chapter 03, and walks the key tiles with the online softmax. What changes
is how a tile of ``C`` is made, in two stages:

* **Folded tiles** (every tile when not causal; left of the diagonal tiles when
  causal): no pre-convolution mask touches them, so ``S0 = S`` and the key axis
  of the convolution folds into the keys,

      C[i, j] = scale * sum_a q_{i-(cq-1)+a} . Kf_a[j],    Kf_a[j] = sum_b w[a, b] k_{j-pk+b},

  with ``Kf`` precomputed once per query head (``cq`` weighted, shifted copies
  of K; O(N) memory). Queries are shifted by loading rows ``i-(cq-1)+a`` (the
  halo of the seed's algorithm, read straight from memory). The program loads
  its ``cq`` shifted query tiles once, side by side, and holds them for the
  whole key walk, so a tile of C is one product of depth ``cq * D`` (two, as
  Triton's shapes are powers of two) against streamed folded keys. When they do
  not fit in shared memory (d = 128), they are reloaded per key tile instead,
  in half-width pieces; on Hopper the copy engine (TMA, through tensor
  descriptors) brings every piece, its out-of-range rows zero-filled, and the
  key and shift loops are flattened into one pipelined loop.
* **Diagonal tiles** (causal, keys within ``E = cq - 1 + pk`` of the query):
  the same folded product, but there the pre-convolution mask matters: folded
  keys would also sum future scores ``S[r, c]``, ``c > r``, which the mask
  zeroes. The wrong entries lie on the ``E`` diagonals ``0 <= delta = i - j < E``,
  and the kernel replaces them. Two small pre-passes compute the past scores
  ``P[r, e] = q_r . k_{r-e}`` (``e = 0..E'``, ``E' = ck + cq - 3``) and from them

      CD[i, delta] = C[i, i - delta] / scale = sum_a sum_e w[a, a - e + delta + pk - (cq-1)] P[i - (cq-1) + a, e];

  the kernel loads one value per row and diagonal. Only past and present keys
  enter a row's scores, so the output stays exactly causal. Then the causal mask
  is applied after the convolution, as in flash attention's diagonal stage.

Key tiles right of the diagonal are never loaded.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .conv_tiles import finish_scores, folded_keys, shifted_queries, shifted_query_tile
from .kernel_parts import (LOG2E, finish_rows, key_tile_bounds, online_softmax_step, program_coordinates,
                           split_product)
from .launch import NO_SPECIALIZE

#: The largest query-axis kernel size ``cq``.
MAX_CQ = 32
#: The largest key-axis kernel size ``ck`` (the fold and the past scores unroll a loop over it).
MAX_CK = 33
#: Largest ``BLOCK_M x cq x BLOCK_D`` tile of shifted queries held for a whole key walk, in bytes.
#: Beyond it the kernel reloads each shifted query tile for every key tile (slower, any size).
RESIDENT_BYTES = 96 * 1024


def query_shift_groups(cq: int) -> tuple[int, int]:
    """``(QA, QB)``: ``cq`` query shifts covered by at most two power-of-two groups (``QB = 0``: one).

    ``QA`` is the largest power of two <= cq and ``QB`` the smallest one >= the
    rest; shifts past ``cq`` in the second group are zero padding (6 = 4 + 2,
    11 = 8 + 4 with one padded).
    """
    qa = 1 << (cq.bit_length() - 1)
    rest = cq - qa
    return qa, (1 << (rest - 1).bit_length()) if rest else 0


def holds_queries(block_m: int, cq: int, block_d: int, elem_bytes: int) -> bool:
    """Whether a program holds its shifted query tiles for the whole key walk (they fit in
    :data:`RESIDENT_BYTES`), rather than reloading them for every key tile."""
    return block_m * sum(query_shift_groups(cq)) * block_d * elem_bytes <= RESIDENT_BYTES


def held_shared_bytes(config: dict, cq: int, block_d: int, elem_bytes: int) -> int:
    """Shared memory of a program that holds its queries (measured from sm_90 builds, exact for 16-bit inputs):
    the held ``[BLOCK_M, (QA + QB) * BLOCK_D]`` shifted queries and ``num_stages`` buffers of a folded-key tile
    ``[BLOCK_N, (QA + QB) * BLOCK_D]`` and a value tile ``[BLOCK_N, BLOCK_D]``."""
    cols = sum(query_shift_groups(cq)) * block_d
    per_stage = config["BLOCK_N"] * (cols + block_d)
    return (config["BLOCK_M"] * cols + max(config["num_stages"], 1) * per_stage) * elem_bytes


def stream_width(block_d: int) -> int:
    """Depth of one streamed product: half the head-dim tile (lighter on registers and shared memory),
    or all of it when that is 16 (``tl.dot`` needs a depth of at least 16)."""
    return block_d if block_d < 32 else block_d // 2


def _resident(args: dict) -> bool:
    return holds_queries(args["BLOCK_M"], args["CQ"], args["BLOCK_D"], args["Q"].element_size())


#: Meta-parameters derived at launch from the chosen tile (``triton.heuristics``).
HEURISTICS = {"QA": lambda args: query_shift_groups(args["CQ"])[0],
              "QB": lambda args: query_shift_groups(args["CQ"])[1],
              "RESIDENT": lambda args: args.get("RESIDENT", _resident(args)),  # the launcher's where it gives one
              "TMA": lambda args: args["QD"] is not None and not args["RESIDENT"],
              "WIDTH": lambda args: stream_width(args["BLOCK_D"])}


@triton.jit
def _attend_tile(acc, m, l, c, v_base, stride_vn, stride_vd, VD, b, kv_h, start_n, offs_k, offs_d, n,
                 MASKED: tl.constexpr, TMA: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr):
    """Fold a tile of convolved scores ``c`` (base-2 units) for keys ``offs_k = start_n + [0, BLOCK_N)`` and
    their values into the state ``(acc, m, l)``. ``MASKED``: the tile may hold keys ``>= n`` or ``-inf``
    entries. ``TMA``: values through the descriptor ``VD`` (keys past ``n`` zero-filled)."""
    k_ok = offs_k < n
    if MASKED:
        c = tl.where(k_ok[None, :], c, float("-inf"))
    if TMA:
        v = VD.load([b, kv_h, start_n, 0]).reshape(offs_k.shape[0], offs_d.shape[0])
    else:
        v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=k_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    return online_softmax_step(acc, m, l, c, v, MASKED, PRECISION)


@triton.jit
def _folded_scores(q_hi, q_lo, q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                   QD, KFD, b, h, i0, start_n, offs_m, offs_k, n, RESIDENT: tl.constexpr, TMA: tl.constexpr,
                   CQ: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]``: ``sum_a q_{i-(cq-1)+a} . Kf_a[j]`` for the keys ``offs_k`` (unscaled).

    ``RESIDENT``: the shifted queries are held for the whole walk (``q_hi``: shifts
    ``[0, QA)``, ``q_lo``: ``[QA, QA + QB)``), so the tile is one or two products
    of depth ``QA * BLOCK_D`` and ``QB * BLOCK_D`` and only folded keys stream in.
    Otherwise (too big to hold) ``cq * BLOCK_D / WIDTH`` products of depth ``WIDTH`` (half the head dim,
    or all of it when ``BLOCK_D = 16``), each piece of a shifted query tile loaded again (from L2) for every
    key tile. ``TMA``: the pieces come through the descriptors ``QD`` (rows ``i0 - (cq-1) + a``; rows before 0
    or past ``n`` zero-filled) and ``KFD`` (folded keys ``[start_n, start_n + BLOCK_N)``).
    """
    if RESIDENT:
        kf_hi = folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, 0, QA, CQ, D, BLOCK_D)
        c = tl.dot(q_hi, kf_hi, input_precision=PRECISION)
        if QB > 0:
            kf_lo = folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, QA, QB, CQ, D, BLOCK_D)
            c = tl.dot(q_lo, kf_lo, c, input_precision=PRECISION)
    else:
        PARTS: tl.constexpr = BLOCK_D // WIDTH
        offs_w = tl.arange(0, WIDTH)
        c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        # A run-time loop over (shift, part of the head dim): half-width stages are
        # lighter on shared memory and registers (no spills at d = 128).
        for s in range(PARTS * CQ):
            a = s // PARTS
            d0 = (s % PARTS) * WIDTH
            if TMA:
                q_a = QD.load([b, h, i0 - (CQ - 1) + a, d0]).reshape(BLOCK_M, WIDTH)
                kf_t = KFD.load([b, h, a, start_n, d0]).reshape(BLOCK_N, WIDTH).T
            else:
                dd = d0 + offs_w
                q_a = shifted_query_tile(q_base, stride_qm, stride_qd, offs_m, dd, n, a, CQ, D)
                kf_t = tl.load(kf_base + a * stride_kfa + offs_k[None, :] * stride_kfn + dd[:, None] * stride_kfd,
                               mask=(dd < D)[:, None] & (offs_k < n)[None, :], other=0.0)
            c = tl.dot(q_a, kf_t, c, input_precision=PRECISION)
    return c


@triton.jit
def _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa, stride_kfn,
                  stride_kfd, stride_vn, stride_vd, QD, KFD, VD, b, h, kv_h, i0, offs_m, offs_d, cd_base,
                  start, stop, n, qk_scale, MASKED: tl.constexpr, DIAGONAL: tl.constexpr, RESIDENT: tl.constexpr,
                  TMA: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, E: tl.constexpr,
                  E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, WIDTH: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Key tiles ``[start, stop)`` folded into ``(acc, m, l)``. ``MASKED``: the key tail ``j >= n``;
    ``DIAGONAL``: causal tiles near the diagonal (masked scores put in, causal mask).

    ``TMA`` flattens this loop and the shift loop inside it into one pipelined loop, so the copy engine
    fetches the next key tile's first pieces while this one finishes (with pointer loads flattening does not help)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(start, stop, BLOCK_N, flatten=TMA):
        offs_k = start_n + offs_n
        c = _folded_scores(q_hi, q_lo, q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                           QD, KFD, b, h, i0, start_n, offs_m, offs_k, n, RESIDENT, TMA, CQ, QA, QB, D, BLOCK_D,
                           WIDTH, BLOCK_M, BLOCK_N, PRECISION)
        c = finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, False, False, E, E_PAD)
        acc, m, l = _attend_tile(acc, m, l, c, v_base, stride_vn, stride_vd, VD, b, kv_h, start_n, offs_k, offs_d,
                                 n, MASKED or DIAGONAL, TMA, D, PRECISION)
    return acc, m, l


@triton.jit
def _diagonal_scores(p_base, w_base, stride_pr, offs_m, n, CQ: tl.constexpr, CK: tl.constexpr,
                     E: tl.constexpr, E_PAD: tl.constexpr, EP_PAD: tl.constexpr):
    """``cd [BLOCK_M, E_PAD]``: ``cd[i, delta]`` is the convolved score ``C[i, i - delta]`` (unscaled) for
    ``0 <= delta < E``, the diagonals the pre-convolution mask reaches; zero for ``delta >= E``.

    ``cd[i, delta] = sum_a sum_e P[i - (cq-1) + a, e] * w[a, b]`` with ``b = a - e + delta + pk - (cq-1)``:
    kernel row ``a`` and column ``b`` pair query ``r = i - (cq-1) + a`` with key ``c = i - delta - pk + b
    = r - e``, a past (or present) key. One product per kernel row; the masked future never enters.
    """
    PK: tl.constexpr = (CK - 1) // 2
    e = tl.arange(0, EP_PAD)[:, None]  # rows of the weight tile: how far back the key is
    delta = tl.arange(0, E_PAD)[None, :]  # columns: the diagonal i - j
    cd = tl.zeros([offs_m.shape[0], E_PAD], dtype=tl.float32)
    for a in range(CQ):
        rows = offs_m - (CQ - 1) + a
        p_a = tl.load(p_base + rows[:, None] * stride_pr + tl.arange(0, EP_PAD)[None, :],
                      mask=((rows >= 0) & (rows < n))[:, None], other=0.0)  # [BLOCK_M, EP_PAD]
        b = a - e + delta + PK - (CQ - 1)
        w_a = tl.load(w_base + a * CK + b, mask=(b >= 0) & (b < CK) & (delta < E), other=0.0)
        cd = tl.dot(p_a, w_a, cd, input_precision="ieee")
    return cd


@triton.jit(do_not_specialize=["n"])
def past_scores_kernel(Q, K, P, stride_qb, stride_qh, stride_qm, stride_qd,
                       stride_kb, stride_kh, stride_kn, stride_kd, stride_pb, stride_ph, stride_pr,
                       n, num_heads, group_size, EP: tl.constexpr, EP_PAD: tl.constexpr,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """``P[b, h, r, e] = q_r . k_{r-e}`` for ``0 <= e <= EP`` (fp32, unscaled), zero before key 0 and past ``EP``.

    Grid: ``(cdiv(n, BLOCK_R), B * Hq)``. ``EP + 1`` dot products per query, so a
    small pre-pass: the shifted loads of K hit the cache.
    """
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, EP_PAD)
    d_ok = offs_d < D
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_r < n)[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    k_base = K + b * stride_kb + (h // group_size) * stride_kh
    p = tl.zeros([BLOCK_R, EP_PAD], dtype=tl.float32)
    for e in tl.static_range(EP + 1):
        keys = offs_r - e
        k_e = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      mask=((keys >= 0) & (keys < n))[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        p = tl.where(offs_e[None, :] == e, tl.sum(q * k_e, 1)[:, None], p)
    tl.store(P + b * stride_pb + h * stride_ph + offs_r[:, None] * stride_pr + offs_e[None, :], p,
             mask=(offs_r < n)[:, None])


@triton.jit(do_not_specialize=["n"])
def past_scores_product_kernel(Q, K, P, stride_qb, stride_qh, stride_qm, stride_qd,
                               stride_kb, stride_kh, stride_kn, stride_kd, stride_pb, stride_ph, stride_pr,
                               n, num_heads, group_size, EP: tl.constexpr, EP_PAD: tl.constexpr,
                               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """:func:`past_scores_kernel`'s ``P`` (``EP_PAD <= BLOCK_R``) from one product per row tile on the tensor
    cores: ``S = q_tile k_window^T`` over the ``2 BLOCK_R`` keys before the tile's last row, of which row ``i``
    keeps the band ``e = r - key`` in ``[0, EP_PAD)`` (zero past ``EP``): every ``(r, e)`` is one element of ``S``.
    For 16-bit inputs (exact products, fp32 sums); fp32 keeps the per-row dot products."""
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    r0 = tl.program_id(0) * BLOCK_R
    offs_r = r0 + tl.arange(0, BLOCK_R)
    keys = r0 - BLOCK_R + tl.arange(0, 2 * BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_r < n)[:, None] & d_ok[None, :], other=0.0)
    k = tl.load(K + b * stride_kb + (h // group_size) * stride_kh + keys[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=((keys >= 0) & (keys < n))[:, None] & d_ok[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k))
    e = offs_r[:, None] - keys[None, :]
    tl.store(P + b * stride_pb + h * stride_ph + offs_r[:, None] * stride_pr + e, tl.where(e <= EP, s, 0.0),
             mask=(e >= 0) & (e < EP_PAD) & (offs_r < n)[:, None])


@triton.jit(do_not_specialize=["n"])
def diagonal_scores_kernel(P, W, CD, stride_pb, stride_ph, stride_pr, n, num_heads,
                           CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
                           EP_PAD: tl.constexpr, BLOCK_R: tl.constexpr):
    """``CD[b, h, i, delta] = C[i, i - delta] / scale`` for ``0 <= delta < E`` (fp32; zero for ``delta >= E``):
    the convolved scores on the diagonals the pre-convolution mask reaches, from the past scores ``P``.
    ``CD`` is contiguous ``[B, Hq, n, E_PAD]``. Grid: ``(cdiv(n, BLOCK_R), B * Hq)``."""
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cd = _diagonal_scores(P + b * stride_pb + h * stride_ph, W + h * CQ * CK, stride_pr, offs_r, n,
                          CQ, CK, E, E_PAD, EP_PAD)
    offs_e = tl.arange(0, E_PAD)
    tl.store(CD + pid_bh * n * E_PAD + offs_r[:, None] * E_PAD + offs_e[None, :], cd, mask=(offs_r < n)[:, None])


@triton.jit(do_not_specialize=["n"])
def fold_keys_kernel(K, W, KF, stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_fb, stride_fh, stride_fa, stride_fn, stride_fd,
                     n, num_heads, group_size, CQ: tl.constexpr, CK: tl.constexpr,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """``KF[b, h, a, j] = sum_t W[h, a, t] * K[b, h // G, j - pk + t]``, zero outside ``[0, n)``.

    Grid: ``(cdiv(n, BLOCK_N), B * Hq)``. Memory-bound: each program walks the
    ``cq`` rows of the kernel over the same ``ck`` shifted tiles of K (cache
    hits after the first row) and writes each folded row once.
    """
    PK: tl.constexpr = (CK - 1) // 2
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    k_base = K + b * stride_kb + (h // group_size) * stride_kh
    for a in range(CQ):
        acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        for t in tl.static_range(CK):
            rows = offs_n - PK + t
            k = tl.load(k_base + rows[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                        mask=((rows >= 0) & (rows < n))[:, None] & d_ok[None, :], other=0.0)
            acc += tl.load(W + (h * CQ + a) * CK + t) * k.to(tl.float32)
        tl.store(KF + b * stride_fb + h * stride_fh + a * stride_fa + offs_n[:, None] * stride_fn
                 + offs_d[None, :] * stride_fd, acc.to(KF.dtype.element_ty),
                 mask=(offs_n < n)[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["n"])
def fold_keys_product_kernel(K, W, KF, stride_kb, stride_kh, stride_kn, stride_kd,
                             stride_fb, stride_fh, stride_fa, stride_fn, stride_fd,
                             n, num_heads, group_size, CQ: tl.constexpr, CK: tl.constexpr,
                             D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """:func:`fold_keys_kernel`'s ``KF`` as ``cq`` products on the tensor cores: ``KF_a[tile] = B_a K_window``, the
    band matrix ``B_a[i, m] = W[h, a, m - i]`` (``0 <= m - i < CK``) against the ``WINDOW >= BLOCK_N + CK - 1``
    keys from the tile's first minus ``pk``, loaded once (the pointer kernel reloads ``ck`` shifted tiles per
    kernel row). For 16-bit keys: ``B_a`` is split into its 16-bit part and the 16-bit rest, two products with
    exact 16-bit multiplies and fp32 sums (:func:`mta.kernel_parts.split_product`), so the fold keeps W's digits
    to ``2^-16`` (bf16) or ``2^-22`` (fp16).
    Grid: ``(cdiv(n, BLOCK_N), B * Hq)``."""
    PK: tl.constexpr = (CK - 1) // 2
    pid_bh = tl.program_id(1).to(tl.int64)  # offsets past 2**31 elements stay exact
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    n0 = tl.program_id(0) * BLOCK_N
    offs_i = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, WINDOW)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    keys = n0 - PK + offs_m
    window = tl.load(K + b * stride_kb + (h // group_size) * stride_kh + keys[:, None] * stride_kn
                     + offs_d[None, :] * stride_kd, mask=((keys >= 0) & (keys < n))[:, None] & d_ok[None, :],
                     other=0.0)
    t = offs_m[None, :] - offs_i[:, None]  # the kernel column that key m of the window is to row i
    in_band = (t >= 0) & (t < CK)
    kf_base = KF + b * stride_fb + h * stride_fh + (n0 + offs_i)[:, None] * stride_fn + offs_d[None, :] * stride_fd
    for a in tl.range(0, CQ, num_stages=1):  # W's band loads hit the cache: no buffers in flight
        band = tl.load(W + (h * CQ + a) * CK + t, mask=in_band, other=0.0)
        kf = split_product(band, window, tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32))
        tl.store(kf_base + a * stride_fa, kf.to(KF.dtype.element_ty), mask=(n0 + offs_i < n)[:, None] & d_ok[None, :])


def fit_stream_descriptors(args: dict) -> None:
    """Give the TMA descriptors of :func:`conv_forward_kernel`'s launch ``args`` (if it has any) the boxes of
    its tile: a ``BLOCK_M x WIDTH`` piece of a shifted query tile, ``BLOCK_N x WIDTH`` of folded keys and
    ``BLOCK_N x BLOCK_D`` of values. Runs before every launch of an autotuned candidate."""
    if args.get("QD") is None:
        return
    width = stream_width(args["BLOCK_D"])
    args["QD"].block_shape = [1, 1, args["BLOCK_M"], width]
    args["KFD"].block_shape = [1, 1, 1, args["BLOCK_N"], width]
    args["VD"].block_shape = [1, 1, args["BLOCK_N"], args["BLOCK_D"]]


@triton.heuristics(HEURISTICS)
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def conv_forward_kernel(Q, KF, V, CD, O, LSE, QD, KFD, VD,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                        stride_ob, stride_oh, stride_om, stride_od,
                        n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                        CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                        E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr,
                        RESIDENT: tl.constexpr, TMA: tl.constexpr, WIDTH: tl.constexpr):
    """``O = softmax(conv(S0, W)) V`` and ``LSE`` (natural log, fp32, ``[B * Hq, n]``), ``n = n_q = n_k``.

    ``KF [B, Hq, CQ, n, D]`` holds the folded keys; ``CD [B, Hq, n, E_PAD]`` (contiguous, causal only)
    the convolved scores on the ``E = cq - 1 + pk`` diagonals where folding is wrong.
    ``QA + QB >= CQ``: the query shifts in two power-of-two groups (``QB = 0``: one);
    ``RESIDENT``: hold them, shifted, for the whole key walk (they fit in shared memory); otherwise
    stream them in pieces ``WIDTH`` wide, through the TMA descriptors ``QD``, ``KFD``, ``VD`` (views of
    ``Q``, ``KF``, ``V`` with boxes of one piece, see :func:`fit_stream_descriptors`) when ``TMA``.
    Grid: ``(cdiv(n, BLOCK_M), B * Hq)``, heaviest (last) query tiles first (:mod:`mta.launch_order`).
    """
    n = n_q
    pid_m, pid_bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=True)
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + b * stride_qb + h * stride_qh
    v_base = V + b * stride_vb + kv_h * stride_vh
    kf_base = KF + b * stride_kfb + h * stride_kfh
    cd_base = CD + pid_bh * n * E_PAD
    # The descriptors take int32 coordinates (a coordinate is one dimension's index, never past 2**31).
    b32, h32, kv_h32 = b.to(tl.int32), h.to(tl.int32), kv_h.to(tl.int32)

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E  # the convolution is linear: convolve in base-2 units
    if RESIDENT:  # the cq shifted query tiles, side by side, loaded once
        q_hi = shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, 0, QA, CQ, D, BLOCK_D)
        if QB > 0:
            q_lo = shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, QA, QB, CQ, D, BLOCK_D)
        else:
            q_lo = q_hi
    else:
        q_hi = 0.0
        q_lo = 0.0

    # Folded scores are exact for every row of the block up to key i0 - E (causal); past it, up to the
    # diagonal, the E masked diagonals are put in. Not causal: every tile is folded, the key tail masked.
    full_stop, masked_stop = key_tile_bounds(i0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    acc, m, l = _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd,
                              stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, b32, h32, kv_h32, i0,
                              offs_m, offs_d, cd_base, 0, full_stop, n, qk_scale, False, False, RESIDENT, TMA,
                              CQ, QA, QB, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    acc, m, l = _folded_tiles(acc, m, l, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd,
                              stride_kfa, stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, b32, h32, kv_h32, i0,
                              offs_m, offs_d, cd_base, full_stop, masked_stop, n, qk_scale, not CAUSAL, CAUSAL,
                              RESIDENT, TMA, CQ, QA, QB, E, E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)

    row_ok = offs_m < n
    d_ok = offs_d < D
    o, lse = finish_rows(acc, m, l)  # every row sees at least its own key: l > 0
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * n + offs_m, lse, mask=row_ok)

"""Split-K decode kernels: a few new queries against a long KV cache, the keys split across programs.

A decode step has few query rows (``n`` new tokens times the ``G`` query heads
of a kv head) and many keys, so one program per query tile would leave most of
the GPU idle. Instead one program owns a (batch, kv head, split) triple: all
``G * n`` rows of its group as the rows of one tile (K and V are read once per
group, the scores are one tensor-core product), and a share of its key tiles:
plain decode gives split ``s`` of ``S`` the tiles ``s, s + S, s + 2S, ...``
(the ``S`` programs of a pair then read neighbouring tiles at the same time,
one front in memory per pair instead of ``S``), MTA decode one contiguous
range. It keeps chapter 02's running state ``(m, l, acc)`` (base-2 units)
over its range and writes it out unnormalised; :func:`decode_combine_kernel`
merges the splits of each row with :func:`merge_states` and normalises.

MTA decode (:mod:`mta.conv_decode`) uses the same kernel. Far from the
diagonal (``i - j >= E = cq - 1 + pk``) the pre-convolution mask does not
touch the scores, and the convolution folds into the *queries*, which are few:

    C[i, j] = scale * sum_b Qf_b[i] . k[j - pk + b],   Qf_b[i] = sum_a w[a, b] q[i - (cq-1) + a],

(:func:`fold_queries_kernel`). A program loads a window of ``BLOCK_N`` keys
once and multiplies it with the ``ck`` folded copies of its rows, stacked into
one tall tile: ``R_b = Qf_b K_window^T``. Shifting each ``R_b``'s columns by
``b`` in registers (one ``tl.gather``) and summing over ``b`` gives
``C[:, y] = sum_b R_b[:, y + b]`` for the ``BLOCK_N - (ck - 1)`` keys ``y`` of
the window that have ``pk`` neighbours on both sides. Windows overlap by ``ck - 1`` keys; the halo at split edges comes
from the cache (masked outside ``[0, len)``). Loading ``ck`` shifted key tiles
instead would move ``ck`` times the bytes from L2, which bounds such a design to
a fraction of the read's bandwidth. The ``E`` keys next
to each query's diagonal are one extra split, the band (:func:`_band_state`),
computed exactly from the definition: every pair of kernel row ``a`` and column
``b`` whose key is not in its query's future. Plain decode is the case
``cq = ck = 1``, ``E = 0``: no fold, no band.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .kernel_parts import LOG2E, finish_rows, online_softmax_step

#: Kernel arguments that stay run-time values (a cache length, query count or split count of 1 is not made a
#: constant: a one-split launch compiled its own variant, which needed more shared memory than an H100 has).
NO_SPECIALIZE = ["n_max", "n_new", "num_splits"]


@triton.jit
def sequence_length(LENS, b, n_max, HAS_LENS: tl.constexpr):
    """Valid keys of sequence ``b``: ``LENS[b]`` clamped to ``[0, n_max]`` (never read outside the cache),
    or ``n_max`` without lengths."""
    seq_len = n_max
    if HAS_LENS:
        seq_len = tl.minimum(tl.maximum(tl.load(LENS + b).to(tl.int32), 0), n_max)
    return seq_len


@triton.jit
def group_rows(tile, kv_h, n_new, group_size, ROWS: tl.constexpr, SLOTS: tl.constexpr):
    """``(h, t, copy, exists)`` for the ``SLOTS`` slots of a program that owns ``ROWS`` rows of kv head ``kv_h``,
    from row ``tile * ROWS`` on: slot ``s`` holds copy ``s // ROWS`` of row ``r = tile * ROWS + s % ROWS``,
    query ``t = r % n`` of query head ``h = kv_h * G + r // n``; ``exists``: ``r < G * n``. The softmax state
    keeps copy 0 (more copies only fill a product's 16 rows, never stored); MTA's stacked folded queries
    keep copy ``b`` for kernel column ``b``."""
    slot = tl.arange(0, SLOTS)
    r = tile * ROWS + slot % ROWS
    return kv_h * group_size + r // n_new, r % n_new, slot // ROWS, r < group_size * n_new


@triton.jit
def merge_states(m, l, acc, m_s, l_s, acc_s):
    """Chapter 02's merge, in base-2 units: the state ``(m, l, acc)`` (``[]``, ``[]``, ``[BLOCK_D]``) merged with
    a block of split states ``(m_s, l_s, acc_s)`` (``[BLOCK_S]``, ``[BLOCK_S]``, ``[BLOCK_S, BLOCK_D]``).
    Each is rescaled to the common max; a state that saw no key (``m = -inf``, ``l = 0``) adds nothing."""
    m_new = tl.maximum(m, tl.max(m_s, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # never -inf - -inf
    alpha = tl.math.exp2(m - m_safe)
    beta = tl.math.exp2(m_s - m_safe)
    return m_new, alpha * l + tl.sum(beta * l_s, 0), alpha * acc + tl.sum(beta[:, None] * acc_s, 0)


@triton.jit
def state_parts(STATE, slots, rows):
    """``(M, L, ACC)``: the parts of the fp32 split states held in one buffer ``STATE``: ``m [S, R]``, then
    ``l [S, R]``, then ``acc [S, R, D]``, for ``slots = S`` and ``rows = R = B * Hq * n`` (one allocation a
    step)."""
    states = rows.to(tl.int64) * slots
    return STATE, STATE + states, STATE + 2 * states


@triton.jit
def store_state(STATE, slots, rows, part, m, l, acc, offs_d, row_ok, D: tl.constexpr):
    """Write the fp32 state ``(m, l, acc)`` of the rows ``part`` (indices into ``[S, B * Hq * n]``) where
    ``row_ok``, into ``STATE``'s parts for ``slots x rows`` states (:func:`state_parts`)."""
    M_PART, L_PART, ACC_PART = state_parts(STATE, slots, rows)
    d_ok = offs_d < D
    tl.store(M_PART + part, m, mask=row_ok)
    tl.store(L_PART + part, l, mask=row_ok)
    tl.store(ACC_PART + part.to(tl.int64)[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _far_tiles(acc, m, l, q, shift, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
               i, offs_d, start, stop, step, seq_len, qk_scale, CK: tl.constexpr, E: tl.constexpr,
               D: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key tiles that start at ``start, start + step, ...`` below ``stop`` (each ``BLOCK_N - (CK - 1)``
    keys, none at or past ``stop``) into ``(acc, m, l)`` for the rows at positions ``i`` (row ``r`` sees
    key ``j`` when ``j <= i - E``).

    Plain attention: ``q [BLOCK_M, BLOCK_D]``, the rows' queries. MTA: the stacked folded queries
    ``[STACK, BLOCK_D]``, stacked row ``s`` holding ``Qf_b`` of row ``s % ROWS`` with ``b = shift[s]``
    (``STACK = CK_PAD * ROWS``; rows with ``b >= CK`` are 0). A tile is one window of
    keys ``[start_n - pk, start_n - pk + BLOCK_N)`` and one product ``R = Qf_stack K_window^T``; shifting each
    stacked row's columns by its ``b`` and summing the ``b`` gives ``C[r, y] = sum_b R_b[r, y + b]``, the
    convolved scores of keys ``start_n + y``, ``y < BLOCK_N - (ck - 1)`` (windows overlap by ``ck - 1``)."""
    PK: tl.constexpr = (CK - 1) // 2
    OWN: tl.constexpr = BLOCK_N - (CK - 1)
    BLOCK_M: tl.constexpr = acc.shape[0]
    STACK: tl.constexpr = q.shape[0]
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)
    if CK > 1:  # each stacked row's column shift, as gather indices
        shifted = tl.minimum(offs_n[None, :] + shift[:, None], BLOCK_N - 1)
    key_stop = tl.minimum(stop + PK, seq_len)  # the last valid column reads key stop - 1 + pk
    for start_n in range(start, stop, step):
        j = start_n + offs_n.to(start.dtype)  # int64 with WIDE offsets: Triton's interpreter loops in Python ints
        window = j - PK
        kt = tl.load(k_base + window[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                     mask=d_ok[:, None] & ((window >= 0) & (window < key_stop))[None, :], other=0.0)
        c = tl.dot(q, kt, input_precision=PRECISION)
        if CK > 1:
            c = tl.sum(tl.reshape(tl.gather(c, shifted, 1), (STACK // ROWS, ROWS, BLOCK_N)), 0)
            if ROWS < BLOCK_M:  # repeat the rows into the program's BLOCK_M slots
                c = tl.reshape(tl.broadcast_to(c[None, :, :], (BLOCK_M // ROWS, ROWS, BLOCK_N)), (BLOCK_M, BLOCK_N))
        own = (j < stop) & (offs_n < OWN)
        s = tl.where(own[None, :] & (j[None, :] <= i[:, None] - E), c * qk_scale, float("-inf"))
        v = tl.load(v_base + j[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=own[:, None] & d_ok[None, :], other=0.0)
        acc, m, l = online_softmax_step(acc, m, l, s, v, True, PRECISION)
    return acc, m, l


@triton.jit
def _band_state(acc, m, l, q_base, stride_qh, stride_qm, stride_qd, W, h, row_ok, k_base, v_base, stride_kn,
                stride_kd, stride_vn, stride_vd, i, offs_d, tile, kv_h, n_new, group_size, seq_len, qk_scale,
                CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr, A_GROUP: tl.constexpr, BAND_STACK: tl.constexpr,
                PRECISION: tl.constexpr):
    """Fold the band, keys ``0 <= i - j < E``, into ``(acc, m, l)``, each score exactly as defined:

        C[i, j] = sum_{a, b} w[a, b] S0[r, c],  r = i - (cq-1) + a,  c = j - pk + b,

    with ``S0[r, c] = q_r . k_c`` for ``0 <= c <= r`` and 0 otherwise (the mask *before* the convolution).
    ``q_base``: the sequence's query cache ``[Hq, n_max, D]``; ``W [Hq, cq, ck]`` (fp32); ``h``, ``row_ok``: each
    slot's query head and whether it is a row to compute. The keys ``j - pk .. j + pk`` of the band are one window,
    loaded once; each kernel row's queries against it are one product, and each kernel column ``b`` a shift of
    that product's columns (as in :func:`_far_tiles`): :func:`_band_scores_stacked` with the kernel rows stacked
    into one product (``BAND_STACK > 0``), else :func:`_band_scores_by_row`."""
    PK: tl.constexpr = (CK - 1) // 2
    d_ok = offs_d < D
    y = tl.arange(0, BLOCK_E)
    j0 = tl.maximum(seq_len - n_new - E + 1, 0)
    j = j0 + y  # every row's band, n + E - 1 keys
    window = j0 - PK + tl.arange(0, BLOCK_W)  # BLOCK_W >= BLOCK_E + ck - 1: key j - pk + b is column y + b
    kt = tl.load(k_base + window[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                 mask=d_ok[:, None] & ((window >= 0) & (window < seq_len))[None, :], other=0.0)
    if BAND_STACK > 0:
        c = _band_scores_stacked(q_base, stride_qh, stride_qm, stride_qd, W, kt, window, y, offs_d, tile, kv_h,
                                 n_new, group_size, seq_len, CQ, CK, D, ROWS, acc.shape[0], A_GROUP, BAND_STACK,
                                 PRECISION)
    else:
        c = _band_scores_by_row(q_base + h[:, None] * stride_qh, stride_qm, stride_qd, W + h * (CQ * CK), kt,
                                window, y, i, row_ok, offs_d, seq_len, CQ, CK, D, PRECISION)
    delta = i[:, None] - j[None, :]
    s = tl.where((delta >= 0) & (delta < E), c * qk_scale, float("-inf"))  # the mask after the convolution
    v = tl.load(v_base + j[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=(j < seq_len)[:, None] & d_ok[None, :], other=0.0)
    return online_softmax_step(acc, m, l, s, v, True, PRECISION)


@triton.jit
def _add_kernel_columns(c, s0, w_row, ok, y, CK: tl.constexpr):
    """``c + sum_b w_row[b] S0[:, y + b]``: one kernel row's columns applied to its scores ``s0 [rows, BLOCK_W]``
    for the band's keys ``y`` (``c [rows, BLOCK_E]``; ``w_row``: each row's ``W[h, a, :]``, 0 where not ``ok``)."""
    for b in tl.static_range(CK):
        w_ab = tl.load(w_row + b, mask=ok, other=0.0)
        c += w_ab[:, None] * tl.gather(s0, tl.broadcast_to((y + b)[None, :], c.shape), 1)
    return c


@triton.jit
def _band_scores_stacked(q_base, stride_qh, stride_qm, stride_qd, W, kt, window, y, offs_d, tile, kv_h, n_new,
                         group_size, seq_len, CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_M: tl.constexpr, A_GROUP: tl.constexpr,
                         BAND_STACK: tl.constexpr, PRECISION: tl.constexpr):
    """The band's convolved scores ``[BLOCK_M, BLOCK_E]`` with the query rows of ``A_GROUP`` kernel rows stacked
    (``BAND_STACK`` rows: row ``s`` is kernel row ``a0 + s // ROWS`` of the program's row ``s % ROWS``,
    :func:`group_rows`): one load, one product and ``ck`` shifts per group; the kernel rows summed at the end."""
    BLOCK_E: tl.constexpr = y.shape[0]
    h_s, t_s, a_s, exists_s = group_rows(tile, kv_h, n_new, group_size, ROWS, BAND_STACK)
    i_s = seq_len - n_new + t_s
    c = tl.zeros([BAND_STACK, BLOCK_E], dtype=tl.float32)
    for a0 in range(0, CQ, A_GROUP):
        a = a0 + a_s
        ok = exists_s & (a_s < A_GROUP) & (a < CQ)
        r = i_s - (CQ - 1) + a  # rows before 0 are the zero padding
        q = tl.load(q_base + h_s[:, None] * stride_qh + r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=(ok & (r >= 0) & (r < seq_len))[:, None] & (offs_d < D)[None, :], other=0.0)
        s0 = tl.dot(q, kt, input_precision=PRECISION)
        s0 = tl.where(window[None, :] <= r[:, None], s0, 0.0)  # S0: no future key
        c = _add_kernel_columns(c, s0, W + (h_s * CQ + a) * CK, ok, y, CK)
    c = tl.sum(tl.reshape(c, (BAND_STACK // ROWS, ROWS, BLOCK_E)), 0)  # the kernel rows' sum, per row
    if ROWS < BLOCK_M:  # repeat the rows into the program's BLOCK_M slots
        c = tl.reshape(tl.broadcast_to(c[None, :, :], (BLOCK_M // ROWS, ROWS, BLOCK_E)), (BLOCK_M, BLOCK_E))
    return c


@triton.jit
def _band_scores_by_row(q_rows, stride_qm, stride_qd, w_rows, kt, window, y, i, row_ok, offs_d, seq_len,
                        CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr):
    """The band's convolved scores ``[SLOTS, BLOCK_E]`` one kernel row at a time: a load of the slots' queries, one
    product and ``ck`` shifts per kernel row. ``q_rows``: each slot's query head in the query cache; ``w_rows``:
    its kernel ``[cq, ck]``."""
    SLOTS: tl.constexpr = q_rows.shape[0]
    BLOCK_E: tl.constexpr = y.shape[0]
    c = tl.zeros([SLOTS, BLOCK_E], dtype=tl.float32)
    for a in range(CQ):
        r = i - (CQ - 1) + a  # rows before 0 are the zero padding
        q_a = tl.load(q_rows + r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                      mask=(row_ok & (r >= 0) & (r < seq_len))[:, None] & (offs_d < D)[None, :], other=0.0)
        s0 = tl.dot(q_a, kt, input_precision=PRECISION)
        s0 = tl.where(window[None, :] <= r[:, None], s0, 0.0)  # S0: no future key
        c = _add_kernel_columns(c, s0, w_rows + a * CK, row_ok, y, CK)
    return c


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def decode_split_kernel(Q, W, K, V, LENS, O, STATE,
                        stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_kb, stride_kh, stride_kn, stride_kd,
                        stride_vb, stride_vh, stride_vn, stride_vd,
                        stride_ob, stride_oh, stride_om, stride_od,
                        n_max, n_new, num_heads, num_kv_heads, num_splits, scale,
                        HAS_LENS: tl.constexpr, ONE_SPLIT: tl.constexpr, FOLD: tl.constexpr,
                        CQ: tl.constexpr, CK: tl.constexpr,
                        E: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
                        BLOCK_M: tl.constexpr, STACK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_W: tl.constexpr, A_GROUP: tl.constexpr, BAND_STACK: tl.constexpr, PDL: tl.constexpr,
                        PRECISION: tl.constexpr, INTERLEAVE: tl.constexpr, WIDE: tl.constexpr = False):
    """The state of one split for the ``G * n`` rows of a (batch, kv head) pair.

    Plain attention: ``Q [B, Hq, n, D]``, the new queries. MTA (``FOLD``): ``Q [B, Hq, n_max, D]``, the query
    cache, and ``W [Hq, CQ, CK]`` (fp32), the kernel; each program folds its rows' queries itself
    (:func:`folded_rows`) and the band reads the cache too.
    The new queries sit at positions ``len - n .. len - 1``. Splits ``0 .. num_splits - 1`` share the keys
    ``[0, len - E)`` tile by tile: with ``INTERLEAVE`` split ``s`` takes every ``num_splits``-th tile from tile
    ``s`` on, else one contiguous range of tiles; split ``num_splits`` (``E > 0``) is the band. ``ONE_SPLIT``: write
    the normalised output to ``O [B, Hq, n, D]``; else the fp32 state to ``STATE``: ``m``, ``l``
    ``[S, B * Hq * n]`` and ``acc`` ``[S, B * Hq * n, D]`` one after the other (:func:`state_parts`; ``m`` in
    base-2 units). ``PDL``: the merge kernel is launched as a programmatic dependent (Hopper on) and may be
    scheduled as soon as every program has started. Grid: ``(splits, B * Hkv, row tiles)``; a row tile is ``ROWS``
    rows in ``BLOCK_M >= 16`` slots (:func:`group_rows`), MTA's stacked ``STACK`` rows (:func:`_far_tiles`).
    ``BAND_STACK > 0``: the band stacks its kernel rows (``A_GROUP`` at a time) into one product, the band's
    program folds nothing and the fold is unrolled; 0: one product per kernel row (the ``band`` form of :class:`mta.decode.DecodePlan`). ``WIDE``: a
    sequence's part of a tensor spans 2**31 elements or more (:func:`mta.decode.wide_offsets`): every index is
    int64, so that no ``index * stride`` wraps around (int32 otherwise, the same code as without the flag).
    """
    if PDL:
        gdc_launch_dependents()
    split = tl.program_id(0)
    b = tl.program_id(1) // num_kv_heads
    kv_h = tl.program_id(1) % num_kv_heads
    group_size = num_heads // num_kv_heads
    if WIDE:  # the indices below derive from these: all int64
        kv_h = kv_h.to(tl.int64)
    h, t, copy, exists = group_rows(tl.program_id(2), kv_h, n_new, group_size, ROWS, BLOCK_M)
    row_ok = exists & (copy == 0)
    seq_len = sequence_length(LENS, b, n_max, HAS_LENS)
    offs_d = tl.arange(0, BLOCK_D)
    if WIDE:
        seq_len, t, offs_d = seq_len.to(tl.int64), t.to(tl.int64), offs_d.to(tl.int64)
    i = seq_len - n_new + t  # each row's position in its sequence
    b64 = b.to(tl.int64)  # a batch of long caches passes 2**31 elements
    k_base = K + b64 * stride_kb + kv_h * stride_kh
    v_base = V + b64 * stride_vb + kv_h * stride_vh
    qk_scale = scale * LOG2E

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Whole key tiles per split, balanced for this sequence's own length; the band split's range is empty.
    n_far = tl.maximum(seq_len - E, 0)
    OWN: tl.constexpr = BLOCK_N - (CK - 1)  # keys per tile (MTA: a window's keys with both halos in it)
    if INTERLEAVE:  # tiles s, s + S, ...: the S splits of a pair stream one front of neighbouring tiles
        start = tl.where(split < num_splits, split * OWN, n_far).to(n_far.dtype)
        stop = n_far
        step = num_splits * OWN
    else:  # one contiguous range of tiles
        per_split = tl.cdiv(tl.cdiv(n_far, OWN), num_splits) * OWN
        start = split * per_split
        stop = tl.minimum(start + per_split, n_far)
        step = OWN
    # The rows of the far tiles' product: MTA stacks ck folded copies of the program's rows (row s: copy
    # s // ROWS of row s % ROWS); plain attention has one copy (STACK = ROWS = BLOCK_M).
    h_s, t_s, shift, exists_s = group_rows(tl.program_id(2), kv_h, n_new, group_size, ROWS, STACK)
    if WIDE:
        t_s = t_s.to(tl.int64)
    q_ok = exists_s & (shift < CK)
    if FOLD:
        if E > 0 and BAND_STACK > 0:
            q_ok = q_ok & (split < num_splits)  # the band's program has no far keys: nothing to fold
        q = folded_rows(Q + b64 * stride_qb, W, h_s, seq_len - n_new + t_s, q_ok, shift, offs_d, seq_len,
                        stride_qh, stride_qm, stride_qd, CQ, CK, D, UNROLL=BAND_STACK > 0).to(Q.dtype.element_ty)
    else:
        q = tl.load(Q + b64 * stride_qb + h_s[:, None] * stride_qh + t_s[:, None] * stride_qm
                    + offs_d[None, :] * stride_qd, mask=q_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    acc, m, l = _far_tiles(acc, m, l, q, shift, k_base, v_base, stride_kn, stride_kd, stride_vn,
                           stride_vd, i, offs_d, start, stop, step, seq_len, qk_scale, CK, E, D, ROWS, BLOCK_N,
                           PRECISION)
    if E > 0:
        if split == num_splits:
            acc, m, l = _band_state(acc, m, l, Q + b64 * stride_qb, stride_qh, stride_qm, stride_qd, W, h, row_ok,
                                    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, i, offs_d,
                                    tl.program_id(2), kv_h, n_new, group_size, seq_len, qk_scale, CQ, CK, E, D,
                                    ROWS, BLOCK_E, BLOCK_W, A_GROUP, BAND_STACK, PRECISION)

    d_ok = offs_d < D
    if ONE_SPLIT:
        o, _ = finish_rows(acc, m, l)
        tl.store(O + b64 * stride_ob + h[:, None] * stride_oh + t[:, None] * stride_om + offs_d[None, :] * stride_od,
                 o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        rows_total = tl.num_programs(1) // num_kv_heads * num_heads * n_new
        row = split * rows_total + (b * num_heads + h) * n_new + t
        store_state(STATE, tl.num_programs(0), rows_total, row, m, l, acc, offs_d, row_ok, D)


@triton.jit(do_not_specialize=["n_max", "n_new", "tiles_per_pair", "tiles_per_program", "total_tiles",
                                 "num_slots"])
def decode_stream_kernel(Q, K, V, LENS, STATE,
                         stride_qb, stride_qh, stride_qm, stride_qd,
                         stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd,
                         n_max, n_new, num_heads, num_kv_heads, row_tiles, tiles_per_pair, tiles_per_program,
                         total_tiles, num_slots, scale,
                         HAS_LENS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                         PRECISION: tl.constexpr, WIDE: tl.constexpr = False):
    """Plain decode with the key tiles of all (batch, kv head, row tile) units dealt out evenly: program ``g``
    takes tiles ``[g * W, (g + 1) * W)`` of the flattened ``units x tiles_per_pair`` range (``W``:
    ``tiles_per_program``, tiles of ``BLOCK_N`` of the cache's ``n_max`` positions), so every SM streams the same
    bytes when the units alone would leave some SMs one program more than others. A range crosses units; for each
    unit it touches, the program writes its state to slot ``g - first(unit)`` of that unit's rows
    (``first(unit) = unit * tiles_per_pair // W``), in :func:`decode_split_kernel`'s layout ``[S, B * Hq * n]``, and
    the program that ends a unit writes empty states (``m = -inf``, ``l = 0``, ``acc = 0``) to the slots up to
    ``num_slots`` that no program fills, so :func:`decode_combine_kernel` merges ``num_slots`` slots of every row.
    Tiles past a sequence's length add nothing. Grid: ``(cdiv(total_tiles, W),)``."""
    if PDL:
        gdc_launch_dependents()
    g = tl.program_id(0)
    group_size = num_heads // num_kv_heads
    rows_total = total_tiles // tiles_per_pair // row_tiles * group_size * n_new
    qk_scale = scale * LOG2E
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    if WIDE:
        offs_d = offs_d.to(tl.int64)
    tile = g * tiles_per_program
    end = tl.minimum(tile + tiles_per_program, total_tiles)
    while tile < end:
        unit = tile // tiles_per_pair
        last = tl.minimum((unit + 1) * tiles_per_pair, end)  # this program's tiles of the unit: [tile, last)
        pair = unit // row_tiles
        b = pair // num_kv_heads
        kv_h = pair % num_kv_heads
        if WIDE:
            kv_h = kv_h.to(tl.int64)
        h, t, copy, exists = group_rows(unit % row_tiles, kv_h, n_new, group_size, ROWS, BLOCK_M)
        row_ok = exists & (copy == 0)
        seq_len = sequence_length(LENS, b, n_max, HAS_LENS)
        if WIDE:
            seq_len, t = seq_len.to(tl.int64), t.to(tl.int64)
        b64 = b.to(tl.int64)
        q = tl.load(Q + b64 * stride_qb + h[:, None] * stride_qh + t[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        first_tile = unit * tiles_per_pair
        start = (tile - first_tile) * BLOCK_N
        if WIDE:
            start = start.to(tl.int64)
        stop = tl.minimum((last - first_tile) * BLOCK_N, seq_len)
        acc, m, l = _far_tiles(acc, m, l, q, copy, K + b64 * stride_kb + kv_h * stride_kh,
                               V + b64 * stride_vb + kv_h * stride_vh, stride_kn, stride_kd, stride_vn, stride_vd,
                               seq_len - n_new + t, offs_d, start, stop, BLOCK_N, seq_len, qk_scale, 1, 0, D, ROWS,
                               BLOCK_N, PRECISION)
        row = (b * num_heads + h) * n_new + t
        slot = g - first_tile // tiles_per_program
        store_state(STATE, num_slots, rows_total, slot * rows_total + row, m, l, acc, offs_d, row_ok, D)
        if last == first_tile + tiles_per_pair:  # the unit's last program: empty states in its unused slots
            for empty in range(slot + 1, num_slots):
                store_state(STATE, num_slots, rows_total, empty * rows_total + row,
                            tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
                            tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32), offs_d, row_ok, D)
        tile = last


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def decode_combine_kernel(STATE, O, stride_ob, stride_oh, stride_om, stride_od,
                          n_new, num_heads, num_splits, D: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    """``O`` for one output row ``(b, h, t)`` (grid: ``B * Hq * n``): the ``num_splits`` states merged
    ``BLOCK_S`` at a time (:func:`merge_states`), then normalised. ``PDL``: launched while the split kernel may
    still run; ``gdc_wait`` holds the program until that kernel has ended and its stores are visible."""
    if PDL:
        gdc_wait()
    row = tl.program_id(0)
    rows_total = tl.num_programs(0)
    M_PART, L_PART, ACC_PART = state_parts(STATE, num_splits, rows_total)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([], float("-inf"), dtype=tl.float32)
    l = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_splits
        part = s.to(tl.int64) * rows_total + row
        m_s = tl.load(M_PART + part, mask=s_ok, other=float("-inf"))
        l_s = tl.load(L_PART + part, mask=s_ok, other=0.0)
        acc_s = tl.load(ACC_PART + part[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                        other=0.0)
        m, l, acc = merge_states(m, l, acc, m_s, l_s, acc_s)
    o = acc / tl.where(l > 0.0, l, 1.0)  # a row that saw no key (a length under n on the device): 0
    t = row % n_new
    b = row // n_new // num_heads
    h = row // n_new % num_heads
    tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + t * stride_om + offs_d * stride_od,
             o.to(O.dtype.element_ty), mask=d_ok)


@triton.jit
def _fold_row(qf, q_base, W, h, i, ok, kb, offs_d, seq_len, stride_qh, stride_qm, stride_qd, a, CQ: tl.constexpr,
              CK: tl.constexpr, D: tl.constexpr):
    """``qf += W[h, a, kb] q[i - (cq-1) + a]``: kernel row ``a``'s share of :func:`folded_rows`."""
    r = i - (CQ - 1) + a
    q_a = tl.load(q_base + h[:, None] * stride_qh + r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                  mask=(ok & (r >= 0) & (r < seq_len))[:, None] & (offs_d < D)[None, :], other=0.0)
    w_a = tl.load(W + (h * CQ + a) * CK + kb, mask=ok, other=0.0)
    return qf + w_a[:, None] * q_a.to(tl.float32)


@triton.jit
def folded_rows(q_base, W, h, i, ok, kb, offs_d, seq_len, stride_qh, stride_qm, stride_qd, CQ: tl.constexpr,
                CK: tl.constexpr, D: tl.constexpr, UNROLL: tl.constexpr = False):
    """``[ROWS, BLOCK_D]`` fp32: row ``r``'s folded query ``Qf_kb[i] = sum_a W[h, a, kb] q[i - (cq-1) + a]``
    (for its head ``h[r]``, position ``i[r]`` and kernel column ``kb[r]``; query rows before 0 are the zero
    padding; rows with ``ok`` false are 0). ``q_base``: one sequence's query cache ``[Hq, n_max, D]``.
    ``UNROLL``: the kernel rows unrolled, so that their loads are issued together (at the head-dim widths of
    :data:`mta.tuning.STACKED_BAND`: elsewhere the split kernel's registers changed with it)."""
    qf = tl.zeros([h.shape[0], offs_d.shape[0]], dtype=tl.float32)
    if UNROLL:
        for a in tl.static_range(CQ):
            qf = _fold_row(qf, q_base, W, h, i, ok, kb, offs_d, seq_len, stride_qh, stride_qm, stride_qd, a, CQ, CK,
                           D)
    else:
        for a in range(CQ):
            qf = _fold_row(qf, q_base, W, h, i, ok, kb, offs_d, seq_len, stride_qh, stride_qm, stride_qd, a, CQ, CK,
                           D)
    return qf


@triton.jit(do_not_specialize=["n_max", "n_new"])
def fold_queries_kernel(Q, W, LENS, QF, stride_qb, stride_qh, stride_qm, stride_qd,
                        stride_fb, stride_fh, stride_fa, stride_fm, stride_fd, n_max, n_new, num_heads,
                        HAS_LENS: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, WIDE: tl.constexpr = False):
    """``QF[b, h, kb, t] = sum_a W[h, a, kb] q[i - (cq-1) + a]`` for the new queries ``i = len - n + t``, in
    QF's dtype (fp32 sums; :func:`folded_rows`, which the split kernel runs for its own rows). Grid:
    ``(B * Hq, CK)``. ``WIDE``: int64 indices, as in :func:`decode_split_kernel`."""
    b = tl.program_id(0) // num_heads
    h = tl.program_id(0) % num_heads
    kb = tl.program_id(1)
    seq_len = sequence_length(LENS, b, n_max, HAS_LENS)
    offs_d = tl.arange(0, BLOCK_D)
    t = tl.arange(0, BLOCK_T)
    if WIDE:
        h, seq_len, offs_d, t = h.to(tl.int64), seq_len.to(tl.int64), offs_d.to(tl.int64), t.to(tl.int64)
    ok = t < n_new
    qf = folded_rows(Q + b.to(tl.int64) * stride_qb, W, h + 0 * t, seq_len - n_new + t, ok, kb + 0 * t, offs_d,
                     seq_len, stride_qh, stride_qm, stride_qd, CQ, CK, D)
    out = QF + b.to(tl.int64) * stride_fb + h * stride_fh + kb * stride_fa + t[:, None] * stride_fm
    tl.store(out + offs_d[None, :] * stride_fd, qf.to(QF.dtype.element_ty), mask=ok[:, None] & (offs_d < D)[None, :])

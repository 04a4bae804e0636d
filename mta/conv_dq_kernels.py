"""The dQ side of the two-phase MTA backward (:mod:`mta.conv_two_phase`): ``dq``'s far part straight from the scratch.

Notation of :mod:`mta.conv_backward`. The far part of ``dq`` is the fold of ``Gq_a = dC_far Kf_a`` over the
query shifts: ``dq[r] = scale sum_a Gq_a[r + cq-1-a]``. Written out,

    dq[r] = scale sum_a sum_j dC_far[r + cq-1-a, j] Kf_a[j],

one product of depth ``cq x keys``: the rows of ``dC_far`` shifted by ``cq-1-a`` against the folded keys of
shift ``a``. A program owns a tile of rows and adds this product for one chunk of keys to the fp32 running
``dq``: ``Gq`` (``cq`` times ``q``'s size per chunk) is never written, and no fold pass reads it back. The
shifted rows come straight from phase 1's rows-major scratch: the product's left operand is a tile of it whose
first row is shifted by a coordinate of the copy engine (which fills rows outside the scratch with zeros), or by
pointer offsets. The shift is along the scratch's outer dimension: the copy engine takes a box at any row, but
only at 16-byte-aligned columns.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel_parts import program_coordinates
from .launch import NO_SPECIALIZE

#: Meta-parameters derived at launch: the copy engine where the launcher made descriptors.
HEURISTICS = {"TMA": lambda args: args["DCD"] is not None}


@triton.heuristics(HEURISTICS)
@triton.jit(do_not_specialize=NO_SPECIALIZE + ["c0", "c1", "row0", "r_lo"])
def conv_dq_far_kernel(DCS, KF, DQ, DCD, KFD, DQD, stride_sb, stride_sm,
                       stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                       stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                       n_q, c0, c1, row0, r_lo, num_heads, scale, N_BUCKET,
                       CAUSAL: tl.constexpr, CQ: tl.constexpr, E: tl.constexpr, D: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr,
                       PRECISION: tl.constexpr, ACCUMULATE: tl.constexpr):
    """``DQ[b, h, r] += scale * sum_a sum_{c0 <= j < c1} dC_far[r + CQ-1-a, j] Kf_a[j]`` (fp32) for the rows
    ``r >= r_lo`` of one chunk of keys ``[c0, c1)``.

    ``DCS``: the chunk's scratch ``[B * Hq, n - row0, c1 - c0]``, ``DCS[bh, i - row0, j - c0] = dC_far[i, j]``
    (keys contiguous; rows before ``row0`` are 0); ``KF``: the folded keys ``[B, Hq, CQ, n, D]``. ``DCD``, ``KFD``:
    TMA descriptors over them (boxes ``[1, BLOCK_M, BLOCK_K]`` and ``[1, 1, 1, BLOCK_K, BLOCK_D]``) and ``DQD`` over
    ``DQ`` (box ``[1, 1, BLOCK_M, BLOCK_D]``: no tile of 64-bit pointers held for the read-modify-write), or all None.
    Causal, a row ``i`` of ``dC_far`` is 0 at keys past ``i - E``: a tile reads the keys up to its last shifted
    row's. Not ``ACCUMULATE`` (the first chunk, which every row reads): ``DQ`` is written, not added to.
    Grid: ``(cdiv(n - r_lo, BLOCK_M), B * Hq)``, the rows that read the most keys first.
    """
    n = n_q
    tile, pid_bh, b, h, _ = program_coordinates(num_heads, 1, HEAVY_LAST=True)
    r0 = r_lo + tile * BLOCK_M
    offs_m = r0 + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    if CAUSAL:  # the tile's last shifted row is r0 + BLOCK_M - 1 + CQ - 1; it reads keys up to that row - E
        k_stop = tl.minimum(c1, tl.maximum(r0 + BLOCK_M + CQ - 1 - E, c0))
    else:
        k_stop = c1
    steps = tl.cdiv(k_stop - c0, BLOCK_K)
    dcs_base = DCS + pid_bh * stride_sb
    kf_base = KF + b * stride_kfb + h * stride_kfh
    b32, h32, bh32 = b.to(tl.int32), h.to(tl.int32), pid_bh.to(tl.int32)  # descriptor coordinates
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for s in tl.range(0, CQ * steps):
        a = s // steps
        j0 = c0 + (s % steps) * BLOCK_K
        if TMA:  # rows outside [0, n - row0) and keys past c1 come in as zeros
            dc = DCD.load([bh32, r0 + (CQ - 1) - a - row0, j0 - c0]).reshape(BLOCK_M, BLOCK_K)
            kf = KFD.load([b32, h32, a, j0, 0]).reshape(BLOCK_K, BLOCK_D)
        else:
            rows = offs_m + (CQ - 1) - a - row0
            keys = j0 + offs_k
            dc = tl.load(dcs_base + rows[:, None] * stride_sm + (keys - c0)[None, :],
                         mask=((rows >= 0) & (rows < n - row0))[:, None] & (keys < c1)[None, :], other=0.0)
            kf = tl.load(kf_base + a * stride_kfa + keys[:, None] * stride_kfn + offs_d[None, :] * stride_kfd,
                         mask=(keys < c1)[:, None] & (offs_d < D)[None, :], other=0.0)
        acc = tl.dot(dc, kf, acc, input_precision=PRECISION)
    dq = acc * scale
    if TMA:  # rows past n: read as 0, not written
        if ACCUMULATE:
            dq += DQD.load([b32, h32, r0, 0]).reshape(BLOCK_M, BLOCK_D)
        DQD.store([b32, h32, r0, 0], dq.reshape(1, 1, BLOCK_M, BLOCK_D))
    else:
        ok = (offs_m < n)[:, None] & (offs_d < D)[None, :]
        dq_ptrs = DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd
        if ACCUMULATE:
            dq += tl.load(dq_ptrs, mask=ok, other=0.0)
        tl.store(dq_ptrs, dq, mask=ok)

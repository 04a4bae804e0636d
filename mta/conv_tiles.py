"""The ``@triton.jit`` tile pieces the MTA kernels share (:mod:`mta.conv_forward`, :mod:`mta.conv_backward`,
:mod:`mta.conv_dc_kernels`), written once.

Notation of :mod:`mta.conv_forward`. A tile of scores is held ``[rows, keys]`` (queries as rows: the forward, the
backward's dQ side) or, ``KEYS_AS_ROWS``, transposed, ``[keys, rows]`` (the backward's dK/dV side where it pays,
and phase 1 of the two-phase backward: ``P^T`` and ``dC^T`` then leave their products as the left operands of
``dV += P^T dO`` and ``U += dC^T Q_shift``, as in Triton's fused-attention tutorial).

* :func:`shifted_query_tile`, :func:`shifted_queries` and :func:`folded_keys`: the operands of the folded
  product ``sum_a q_{i-(cq-1)+a} . Kf_a[j]``;
* :func:`finish_scores` (with :func:`put_diagonals`): folded scores to convolved scores in base-2 units, the
  masked diagonals put in and the causal mask applied near the diagonal;
* :func:`score_gradient`: ``dC_far`` from ``P``;
* :func:`by_row`, :func:`by_key`: a per-row or per-key vector broadcast against a tile in either layout.

Every backward kernel (:func:`mta.conv_backward.conv_dq_kernel`'s key tiles,
:func:`mta.conv_backward.conv_dkdv_kernel`'s query tiles in either layout, :func:`mta.conv_dc_kernels.conv_dc_kernel`'s
query tiles) runs the same tile body on its folded product ``c``:

    C = finish_scores(c)               the masked diagonals put in, the causal mask, the key tail
    P = exp2(C - lse2)                 in the kernel
    dV += P^T dO                       in the kernel, on the dK/dV sides
    dC_far = score_gradient(P, dO, V, Delta)

The kernels read ``lse``, ``dO``, ``Delta`` and ``V`` at different points of it (held for a whole walk, or loaded
per tile just before their first use), and where a load sits in a loop's body decides how Triton's pipeliner
stages it. So the loads, ``P`` and ``dV`` stay in the kernels, and the compiled kernels are the same as with the
body written out in each.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def by_row(x, KEYS_AS_ROWS: tl.constexpr):
    """A vector over the tile's query rows, broadcast against its keys."""
    if KEYS_AS_ROWS:
        y = x[None, :]
    else:
        y = x[:, None]
    return y


@triton.jit
def by_key(x, KEYS_AS_ROWS: tl.constexpr):
    """A vector over the tile's keys, broadcast against its query rows."""
    if KEYS_AS_ROWS:
        y = x[:, None]
    else:
        y = x[None, :]
    return y


@triton.jit
def shifted_query_tile(q_base, stride_qm, stride_qd, offs_m, offs_d, n, a, CQ: tl.constexpr, D: tl.constexpr):
    """``q[i - (cq-1) + a]`` for the tile's rows ``i``; rows outside ``[0, n)`` load 0."""
    rows = offs_m - (CQ - 1) + a
    return tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   mask=((rows >= 0) & (rows < n))[:, None] & (offs_d < D)[None, :], other=0.0)


@triton.jit
def shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, A0: tl.constexpr, NA: tl.constexpr,
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
def folded_keys(kf_base, stride_kfa, stride_kfn, stride_kfd, offs_k, n, A0: tl.constexpr, NA: tl.constexpr,
                CQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """``[NA * BLOCK_D, BLOCK_N]``: row ``a' * BLOCK_D + d`` holds ``Kf_{A0 + a'}[j, d]``, the match of
    :func:`shifted_queries`."""
    rows = tl.arange(0, NA * BLOCK_D)
    a = A0 + rows // BLOCK_D
    d = rows % BLOCK_D
    ok = ((a < CQ) & (d < D))[:, None] & (offs_k < n)[None, :]
    return tl.load(kf_base + a[:, None] * stride_kfa + d[:, None] * stride_kfd + offs_k[None, :] * stride_kfn,
                   mask=ok, other=0.0)


@triton.jit
def put_diagonals(c, cd_base, offs_m, offs_k, n, KEYS_AS_ROWS: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr):
    """``c`` with ``CD[i, i - j]`` on the ``E`` diagonals ``0 <= i - j < E`` (the causal mask after the
    convolution is :func:`finish_scores`'s). ``CD`` rows are ``E_PAD`` wide.

    One column of ``CD`` per diagonal, loaded as a vector over the tile's rows: it
    lands in the rows' own registers, where a 2D gather would be reshuffled through
    shared memory."""
    row_ok = offs_m < n
    for d in tl.static_range(E):
        cd_d = tl.load(cd_base + offs_m * E_PAD + d, mask=row_ok, other=0.0)
        on_d = by_row(offs_m, KEYS_AS_ROWS) - by_key(offs_k, KEYS_AS_ROWS) == d
        c = tl.where(on_d, by_row(cd_d, KEYS_AS_ROWS), c)
    return c


@triton.jit
def finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL: tl.constexpr, MASK_KEYS: tl.constexpr,
                  KEYS_AS_ROWS: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr):
    """Folded scores ``c`` to convolved scores in base-2 units; near the diagonal, the exactly convolved
    scores put in (from ``cd_base``, rows of ``E_PAD``) and the causal mask, applied after the scaling (a
    ``scale <= 0`` would turn a ``-inf`` put in before it into ``+inf`` or NaN). ``MASK_KEYS``: keys past ``n``
    get ``-inf``."""
    if DIAGONAL:
        c = put_diagonals(c, cd_base, offs_m, offs_k, n, KEYS_AS_ROWS, E, E_PAD) * qk_scale
        c = tl.where(by_row(offs_m, KEYS_AS_ROWS) - by_key(offs_k, KEYS_AS_ROWS) >= 0, c, float("-inf"))
    else:
        c = c * qk_scale
    if MASK_KEYS:
        c = tl.where(by_key(offs_k < n, KEYS_AS_ROWS), c, float("-inf"))
    return c


@triton.jit
def score_gradient(p, do, v, delta, offs_m, offs_k, DIAGONAL: tl.constexpr, KEYS_AS_ROWS: tl.constexpr,
                   E: tl.constexpr, PRECISION: tl.constexpr):
    """``dC_far`` (fp32) of a tile from its probabilities ``p = exp2(C - lse2)``: ``dP = dO V^T``,
    ``dC = P * (dP - delta)``, kept only where ``i - j >= E`` on the ``DIAGONAL`` tiles (the near entries are
    :func:`mta.conv_backward.conv_near_kernel`'s).

    Tiles are ``[rows, keys]``, or ``[keys, rows]`` when ``KEYS_AS_ROWS``; ``v`` is ``V^T [BLOCK_D, keys]``, or
    ``V [keys, BLOCK_D]`` when ``KEYS_AS_ROWS``; ``do [rows, BLOCK_D]``; ``delta`` per row."""
    if KEYS_AS_ROWS:
        dp = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    else:
        dp = tl.dot(do, v, input_precision=PRECISION)
    dc = p * (dp - by_row(delta, KEYS_AS_ROWS))
    if DIAGONAL:
        dc = tl.where(by_row(offs_m, KEYS_AS_ROWS) - by_key(offs_k, KEYS_AS_ROWS) >= E, dc, 0.0)
    return dc

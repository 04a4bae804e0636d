"""The ``@triton.jit`` pieces every attention kernel of ``mta`` shares, written once.

* :func:`program_coordinates`: which tile, batch, query head and kv head a program owns;
* :func:`key_tile_bounds`: which key tiles a causal query tile sees, and which of them need a mask;
  :func:`query_tile_bounds`: the same for the query tiles that see a key tile (the backward's dK/dV walk);
* :func:`online_softmax_step` and :func:`finish_rows`: chapter 02's running ``(m, l, acc)`` state,
  updated with a tile of scores and normalised at the end;
* ``LOG2E`` and ``LN2``: scores are kept in base-2 units (``s * scale * log2(e)``) so that ``exp2``
  replaces ``exp``; ``LN2`` turns a base-2 log-sum-exp back into a natural one;
* :func:`split_product`: an fp32 matrix times a 16-bit one on the tensor cores, the fp32 one in two 16-bit parts
  (the band-matrix folds).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch_order import heaviest_first

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def program_coordinates(num_heads, group_size, HEAVY_LAST: tl.constexpr):
    """``(tile, pid_bh, b, h, kv_h)`` for a ``(num_tiles, B * num_heads)`` grid, heaviest tiles first
    (:func:`mta.launch_order.heaviest_first`). Head ``h`` reads kv head ``h // group_size``
    (a grid over kv heads passes ``group_size = 1``). ``pid_bh``, ``b``, ``h``, ``kv_h`` are int64, so that
    the offsets of a program's batch and head stay exact past 2**31 elements; ``tile`` stays int32."""
    tile, pid_bh = heaviest_first(HEAVY_LAST)
    pid_bh = pid_bh.to(tl.int64)  # base offsets like b * stride_b pass 2**31 elements on large batches
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    return tile, pid_bh, b, h, h // group_size


@triton.jit
def key_tile_bounds(m0, n_k, diag, REACH, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(full_stop, masked_stop)`` for the query rows ``[m0, m0 + BLOCK_M)``: key tiles ``[0, full_stop)`` need
    no mask for any row, keys ``[full_stop, masked_stop)`` do, and keys from ``masked_stop`` on are never seen.

    Causal: query ``i`` sees keys ``j <= i + diag`` (bottom-right alignment, ``diag = n_k - n_q``); keys
    within ``REACH`` of the diagonal also go to the masked part (0 for plain attention; MTA's ``E``
    diagonals, where the convolution meets the pre-convolution mask). Not causal: only the key tail
    past the last whole tile is masked.
    """
    if CAUSAL:
        full_stop = tl.minimum(tl.maximum(m0 + diag + 1 - REACH, 0), n_k) // BLOCK_N * BLOCK_N
        masked_stop = tl.minimum(tl.maximum(m0 + BLOCK_M + diag, 0), n_k)
    else:
        full_stop = n_k // BLOCK_N * BLOCK_N
        masked_stop = n_k
    return full_stop, masked_stop


@triton.jit
def query_tile_bounds(n0, n_q, diag, REACH, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(start, m_full)`` for the keys ``[n0, n0 + BLOCK_N)`` (the backward's dK/dV walk over query tiles): query
    tiles before ``start`` see none of them; from ``m_full`` on, every row sees all of them with no mask; the
    tiles between are masked. Causal as in :func:`key_tile_bounds` (query ``i`` sees keys ``j <= i + diag``;
    rows within ``REACH`` of a key also go to the masked part); not causal, every tile from 0 is unmasked."""
    if CAUSAL:
        start = tl.maximum(n0 - diag, 0) // BLOCK_M * BLOCK_M
        m_full = tl.minimum(tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - diag + REACH, 0), BLOCK_M) * BLOCK_M,
                            tl.cdiv(n_q, BLOCK_M) * BLOCK_M)
        m_full = tl.maximum(m_full, start)
    else:
        start = 0
        m_full = 0
    return start, m_full


@triton.jit
def online_softmax_step(acc, m, l, s, v, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold a tile of scores ``s [BLOCK_M, BLOCK_N]`` (base-2 units, ``-inf`` where masked) and its values
    ``v [BLOCK_N, BLOCK_D]`` into the running max ``m``, normaliser ``l`` and output ``acc``.

    ``MASKED``: a row may have seen only masked keys so far; it keeps ``m = -inf`` and subtracts 0
    instead (``exp2(-inf) = 0``), never ``-inf - -inf``.
    """
    m_new = tl.maximum(m, tl.max(s, 1))
    if MASKED:
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(s - m_new_safe[:, None])
    alpha = tl.math.exp2(m - m_new_safe)  # rescales what was accumulated under the old max
    l = l * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_new, l


@triton.jit
def finish_rows(acc, m, l):
    """``(o, lse)``: ``o = acc / l`` and the natural-log ``lse = (m + log2 l) ln 2``; a row that saw no key
    (causal with more queries than keys) gets ``o = 0`` and ``lse = -inf``."""
    seen = l > 0.0
    l_safe = tl.where(seen, l, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, (m + tl.math.log2(l_safe)) * LN2, float("-inf"))
    return o, lse


@triton.jit
def split_product(band, x, acc):
    """``acc + band @ x`` for an fp32 ``band`` and a 16-bit ``x``: ``band`` goes in as two 16-bit parts, its
    rounding and the rest, each product's multiplies exact and its sums fp32; ``band`` is kept to ``2^-16``
    relative in bf16 (``2^-22`` in fp16, where it must stay below fp16's largest value)."""
    band_hi = band.to(x.dtype)
    acc = tl.dot(band_hi, x, acc)
    return tl.dot((band - band_hi.to(tl.float32)).to(x.dtype), x, acc)

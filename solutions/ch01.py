"""Reference solutions to chapter 01's exercises (try them yourself first).

Checked by ``tests/test_exercises_01_02.py`` with the checkers in ``mta/course/exercises/ch01.py``.
"""

from __future__ import annotations

import math

import torch


def causal_attention(q, k, v):
    """Exercise 1: causal attention, bottom-right aligned, GQA, one ``masked_fill``.

    ``q [B, Hq, Nq, d]``, ``k, v [B, Hkv, Nk, d]``, ``Nq <= Nk``.
    """
    Hq, Nq, d = q.shape[1], q.shape[-2], q.shape[-1]
    Nk = k.shape[-2]
    g = Hq // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # query head h reads kv head h // g
    S = d ** -0.5 * (q @ k.transpose(-2, -1))
    future = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).triu(Nk - Nq + 1)  # j > i + (Nk - Nq)
    return torch.softmax(S.masked_fill(future, float("-inf")), dim=-1) @ v


def first_n_not_fitting(B, H, itemsize, capacity_bytes):
    """Exercise 2: the smallest N with ``2 * B * H * N**2 * itemsize > capacity_bytes``.

    Integer arithmetic throughout: ``per * N**2 > C`` holds exactly when ``N**2 > C // per``.
    """
    per_n2 = 2 * B * H * itemsize  # bytes of S and P per unit of N^2
    return math.isqrt(int(capacity_bytes) // per_n2) + 1


def decode_intensity(Hq, Hkv, Nq, Nk, d, itemsize, *, kv_once_per_group):
    """Exercise 3: FLOPs per byte of Q, K, V, O traffic for a fused kernel."""
    flops = 4 * Hq * Nq * Nk * d                       # Q K^T and P V, 2 * Nq * Nk * d each, per query head
    kv_heads = Hkv if kv_once_per_group else Hq        # how many copies of K and V are read
    moved = (2 * Hq * Nq * d + 2 * kv_heads * Nk * d) * itemsize  # Q read + O written; K and V read
    return flops / moved


def tiled_traffic(N, d, itemsize, block_m, block_n, *, causal):
    """Exercise 4: HBM bytes of a tiled forward kernel for one head (Nq = Nk = N)."""
    kv_rows = 0
    for m_start in range(0, N, block_m):
        m_end = min(m_start + block_m, N)             # this tile's rows are m_start .. m_end - 1
        if causal:                                    # blocks up to the one holding key m_end - 1
            kv_rows += min(N, block_n * math.ceil(m_end / block_n))
        else:
            kv_rows += N
    return (2 * N + 2 * kv_rows) * d * itemsize        # Q read, O written once; K and V per tile

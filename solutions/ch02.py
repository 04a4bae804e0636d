"""Reference solutions to chapter 02's exercises (try them yourself first).

Checked by ``tests/test_exercises_01_02.py`` with the checkers in ``mta/course/exercises/ch02.py``.
"""

from __future__ import annotations

import math

import torch

import mta


def stream_normalizer(stream):
    """Exercise 1: ``(m, l)`` of a stream read once, in O(1) memory; ``-inf`` entries are masked."""
    m, l = float("-inf"), 0.0
    for x in stream:
        if x == float("-inf"):
            continue                                  # weight e^(-inf) = 0; also avoids -inf - (-inf)
        m_new = max(m, x)
        l = l * math.exp(m - m_new) + math.exp(x - m_new)  # exp(-inf) = 0.0 on the first finite value
        m = m_new
    return m, l


def my_merge(a, b):
    """Exercise 2: the boxed merge formula, with the empty state (m = -inf) as identity."""
    m = torch.maximum(a.m, b.m)

    def rescale(m_side):                              # e^(m_side - m), 0 where m is still -inf
        return torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(m_side - m))

    alpha, beta = rescale(a.m), rescale(b.m)
    return mta.AttentionState(m=m, l=alpha * a.l + beta * b.l,
                              acc=alpha[..., None] * a.acc + beta[..., None] * b.acc)


def block_state(s, v):
    """Exercise 3: ``(m, l, acc)`` of scores ``s [..., Nq, n]`` over values ``v [..., n, D]``.

    (a) A fully masked row has m = max of nothing finite = -inf; every weight e^(s - m) must be
        e^(-inf) = 0, so l = 0 and acc = 0: exactly the empty state, the identity of the merge.
    (b) merge(x, empty): m = max(m_x, -inf) = m_x, so x is rescaled by e^0 = 1 exactly and the empty
        side by 0; x.l * 1 + 0 * 0 == x.l with no rounding, and likewise for acc. If x is empty too,
        the guarded rescale factor gives 0 instead of NaN and the result stays empty.
    (c) s - s.max() is -inf - (-inf) = NaN, so p is NaN, and NaN would spread through every later
        merge. Since a fully masked block changes nothing, a causal kernel may skip it without even
        loading it (chapter 03).
    """
    m = s.amax(dim=-1)                                # each row's own max; -inf for a fully masked row
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # subtract 0 there, not -inf
    p = torch.exp(s - m_safe[..., None])              # masked scores give exactly 0
    return mta.AttentionState(m=m, l=p.sum(dim=-1), acc=p @ v)


def online_attention(q, k, v, *, block_size, causal=False):
    """Exercise 4: attention one key block at a time, with a running ``(m, l, acc)`` per query."""
    Hq, Nq, D = q.shape[1], q.shape[-2], q.shape[-1]
    Nk = k.shape[-2]
    g = Hq // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    state = mta.empty_state(q.shape[:-1], D, dtype=q.dtype, device=q.device)
    rows = torch.arange(Nq, device=q.device)[:, None]
    for start in range(0, Nk, block_size):
        stop = min(start + block_size, Nk)
        s = D ** -0.5 * (q @ k[..., start:stop, :].transpose(-1, -2))  # [..., Nq, stop - start]
        if causal:
            cols = torch.arange(start, stop, device=q.device)[None, :]
            s = s.masked_fill(cols > rows + (Nk - Nq), float("-inf"))   # bottom-right alignment
        state = my_merge(state, block_state(s, v[..., start:stop, :]))
    seen = state.l > 0
    o = state.acc / torch.where(seen, state.l, torch.ones_like(state.l))[..., None]
    lse = torch.where(seen, state.m + torch.log(state.l), torch.full_like(state.m, float("-inf")))
    return o, lse

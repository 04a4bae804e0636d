"""Reference solutions to chapter 06's exercises (split-K decode). Try the exercises first.

Checked by ``tests/test_exercises_06.py`` with the checkers in :mod:`mta.course.exercises.ch06`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU, before Triton is imported)
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


# Exercise 1: split-K decode in PyTorch, the splits merged with chapter 02's states.
def split_decode(q, k_cache, v_cache, cache_seqlens, num_splits):
    """``o [B, Hq, Nq, D]``: per sequence, its ``L`` keys cut into ``num_splits`` contiguous ranges of
    ``ceil(L / num_splits)`` keys, one state per range, merged, normalised."""
    B, Hq, Nq, D = q.shape
    G = Hq // k_cache.shape[1]
    out = torch.empty_like(q)
    t = torch.arange(Nq)
    for b, L in enumerate(cache_seqlens):
        k = k_cache[b, :, :L].repeat_interleave(G, 0)            # [Hq, L, D]: query head h reads kv head h // G
        v = v_cache[b, :, :L].repeat_interleave(G, 0)
        per = -(-L // num_splits)
        state = mta.empty_state((Hq, Nq), D, dtype=q.dtype)
        for s in range(num_splits):
            start, stop = s * per, min((s + 1) * per, L)
            if start >= stop:                                     # no key: the empty state, merging it is a no-op
                continue
            j = torch.arange(start, stop)
            scores = D ** -0.5 * q[b] @ k[:, start:stop].transpose(-1, -2)
            scores = scores.masked_fill(j[None, :] > (L - Nq + t)[:, None], float("-inf"))   # bottom-right causal
            state = mta.merge_states(state, mta.attention_state(scores, v[:, start:stop]))
        out[b] = mta.finalize_state(state)[0]
    return out


# Exercise 2: the combine kernel, one program per output row.
@triton.jit
def combine_kernel(M, L, ACC, O, num_splits, num_rows, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([], float("-inf"), dtype=tl.float32)
    l = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_splits
        m_s = tl.load(M + s * num_rows + row, mask=s_ok, other=float("-inf"))
        l_s = tl.load(L + s * num_rows + row, mask=s_ok, other=0.0)
        acc_s = tl.load(ACC + (s[:, None] * num_rows + row) * D + offs_d[None, :],
                        mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        m_new = tl.maximum(m, tl.max(m_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)    # nothing seen yet: never -inf - (-inf)
        alpha = tl.exp(m - m_safe)
        beta = tl.exp(m_s - m_safe)
        l = alpha * l + tl.sum(beta * l_s, 0)
        acc = alpha * acc + tl.sum(beta[:, None] * acc_s, 0)
        m = m_new
    o = acc / tl.where(l > 0.0, l, 1.0)                          # a row that saw no key: 0
    tl.store(O + row * D + offs_d, o, mask=d_ok)


def combine(m_part, l_part, acc_part):
    """``o [R, D]`` fp32 from split states ``m, l [S, R]``, ``acc [S, R, D]`` (natural-log units)."""
    S, R, D = acc_part.shape
    o = torch.empty((R, D), device=acc_part.device, dtype=torch.float32)
    combine_kernel[(R,)](m_part, l_part, acc_part, o, S, R, D=D, BLOCK_D=triton.next_power_of_2(D), BLOCK_S=16)
    return o


# Exercise 3: MTA's newest rows, from the window of the last cq - 1 + n queries.
def mta_decode_rows(q_cache, k_cache, v_cache, weight, cache_seqlens, num_queries):
    """``o [B, Hq, n, D]``: scores of the window's queries, zeroed in their future, convolved (the window supplies
    the ``cq - 1`` rows above each new query), masked after the convolution, softmax, ``@ v``."""
    B, Hq, _, D = q_cache.shape
    n = num_queries
    cq, ck = weight.shape[1:]
    pk = (ck - 1) // 2
    G = Hq // k_cache.shape[1]
    out = q_cache.new_empty(B, Hq, n, D)
    for b, L in enumerate(cache_seqlens):
        rows = torch.arange(L - n - (cq - 1), L)                 # the window; positions before 0 are zero padding
        q = torch.where((rows >= 0)[:, None], q_cache[b][:, rows.clamp_min(0)], 0.0)
        k = k_cache[b, :, :L].repeat_interleave(G, 0)
        v = v_cache[b, :, :L].repeat_interleave(G, 0)
        keys = torch.arange(L)
        s = D ** -0.5 * q @ k.transpose(-1, -2)                   # [Hq, cq - 1 + n, L]
        s = s.masked_fill(keys[None, :] > rows[:, None], 0.0)     # the zero before the convolution
        c = F.conv2d(F.pad(s, (pk, pk))[None], weight[:, None], groups=Hq)[0]   # [Hq, n, L]
        c = c.masked_fill(keys[None, :] > rows[cq - 1:, None], float("-inf"))   # the -inf after it
        out[b] = torch.softmax(c, -1) @ v
    return out

"""Reference solutions to chapter 06's exercises (split-K decode). Try the exercises first.

Checked by ``tests/test_exercises_06.py`` with the checkers in :mod:`mta.course.exercises.ch06`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU, before Triton is imported)
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


# Exercise 1: the split kernel, one program per (sequence, kv head, split).
@triton.jit
def split_kernel(Q, K, V, LENS, M, L, ACC, scale, num_splits, num_kv_heads, n_max, n_new, num_rows,
                 G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    s = tl.program_id(0)
    pair = tl.program_id(1)                                       # b * Hkv + h_kv: K and V of this pair
    b = pair // num_kv_heads
    seq_len = tl.load(LENS + b)
    per = tl.cdiv(seq_len, num_splits)
    start = s * per
    stop = tl.minimum(start + per, seq_len)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < G * n_new
    d_ok = offs_d < D
    pos = seq_len - n_new + offs_m % n_new                        # row r is query r % Nq of head h_kv * G + r // Nq
    rows = pair * G * n_new + offs_m                              # its row of q [B, Hq, Nq, D] and of the states
    q = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for j0 in range(start, stop, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < stop                                      # never past the split, nor past the length
        kv = (pair * n_max + offs_n)[:, None] * D + offs_d[None, :]
        k = tl.load(K + kv, mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(V + kv, mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        x = scale * tl.dot(q, tl.trans(k), input_precision="ieee")
        x = tl.where(n_ok[None, :] & (offs_n[None, :] <= pos[:, None]), x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # a row that saw no key yet: never -inf - (-inf)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(x - m_safe[:, None])
        l = alpha * l + tl.sum(p, 1)
        acc = alpha[:, None] * acc + tl.dot(p, v, input_precision="ieee")
        m = m_new
    out = s * num_rows + rows
    tl.store(M + out, m, mask=row_ok)
    tl.store(L + out, l, mask=row_ok)
    tl.store(ACC + out[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


def split_states(q, k_cache, v_cache, cache_seqlens, num_splits):
    """``(m, l [S, B, Hq, Nq], acc [S, B, Hq, Nq, D])`` fp32: split ``s`` of sequence ``b`` holds keys
    ``[s * per, min((s + 1) * per, L))``, ``per = ceil(L / S)``; natural-log units."""
    B, Hq, Nq, D = q.shape
    Hkv, n_max = k_cache.shape[1:3]
    G = Hq // Hkv
    m = torch.empty((num_splits, B, Hq, Nq), device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty((num_splits, B, Hq, Nq, D), device=q.device, dtype=torch.float32)
    split_kernel[(num_splits, B * Hkv)](
        q, k_cache, v_cache, cache_seqlens, m, l, acc, D ** -0.5, num_splits, Hkv, n_max, Nq, B * Hq * Nq,
        G=G, D=D, BLOCK_M=max(16, triton.next_power_of_2(G * Nq)), BLOCK_N=16,
        BLOCK_D=max(16, triton.next_power_of_2(D)))
    return m, l, acc


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


# Exercise 4: the band's scores, one program per (sequence, query head).
@triton.jit
def band_kernel(Q, K, W, LENS, OUT, scale, num_heads, group_size, n_max, n_new,
                CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr, D: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    PK: tl.constexpr = (CK - 1) // 2
    pid = tl.program_id(0)                                        # b * Hq + h
    b = pid // num_heads
    h = pid % num_heads
    kv = b * (num_heads // group_size) + h // group_size          # query head h reads kv head h // G
    seq_len = tl.load(LENS + b)
    t = tl.arange(0, BLOCK_T)
    delta = tl.arange(0, BLOCK_E)
    offs_d = tl.arange(0, D)
    row_ok = t < n_new
    i = seq_len - n_new + t                                       # the new queries' positions
    j = i[:, None] - delta[None, :]                               # each row's band keys [BLOCK_T, BLOCK_E]
    c = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for a in tl.static_range(CQ):
        r = i - (CQ - 1) + a                                      # the window's rows; before 0: zero padding
        q = tl.load(Q + (pid * n_max + r[:, None]) * D + offs_d[None, :], mask=(row_ok & (r >= 0))[:, None],
                    other=0.0)
        for kb in tl.static_range(CK):
            col = j - PK + kb                                     # the key of kernel column kb
            ok = row_ok[:, None] & (col >= 0) & (col <= r[:, None])   # S0 is 0 in the future: never load it
            k = tl.load(K + (kv * n_max + col[:, :, None]) * D + offs_d[None, None, :], mask=ok[:, :, None],
                        other=0.0)
            c += tl.load(W + (h * CQ + a) * CK + kb) * tl.sum(q[:, None, :] * k, 2)
    c = tl.where(j >= 0, scale * c, float("-inf"))                # no key before position 0
    tl.store(OUT + (pid * n_new + t[:, None]) * E + delta[None, :], c, mask=row_ok[:, None] & (delta < E)[None, :])


def band_scores(q_cache, k_cache, weight, cache_seqlens, num_queries):
    """``[B, Hq, n, E]`` fp32: ``C[i, i - delta]`` for the ``n`` newest queries ``i``, ``-inf`` before key 0."""
    B, Hq, n_max, D = q_cache.shape
    cq, ck = weight.shape[1:]
    E = cq - 1 + (ck - 1) // 2
    out = torch.empty((B, Hq, num_queries, E), device=q_cache.device, dtype=torch.float32)
    band_kernel[(B * Hq,)](q_cache, k_cache, weight.contiguous(), cache_seqlens, out, D ** -0.5, Hq,
                           Hq // k_cache.shape[1], n_max, num_queries, CQ=cq, CK=ck, E=E, D=D,
                           BLOCK_T=triton.next_power_of_2(num_queries), BLOCK_E=triton.next_power_of_2(E))
    return out

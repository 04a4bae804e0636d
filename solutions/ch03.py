"""Reference solutions to chapter 03's exercises (FlashAttention-2 in Triton). Try the exercises first.

Checked by ``tests/test_exercises_03.py`` with the checkers in :mod:`mta.course.exercises.ch03`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU, before Triton is imported)
import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def precision(dtype):
    """True fp32 products for fp32 inputs (on a GPU ``tl.dot`` would use TF32 by default)."""
    return "ieee" if dtype == torch.float32 else "tf32"


# Exercise 1: the forward kernel, causal or not, in two stages.
@triton.jit
def _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, start, stop, n_k, diag, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, T_K: tl.constexpr,
                    PRECISION: tl.constexpr):
    """Fold the key tiles ``[start, stop)`` into the state ``(acc, m, l)`` of one query tile; also return how many
    tiles were visited. ``MASKED`` tiles may cross the end of the keys or (``CAUSAL``) the diagonal."""
    offs_n = tl.arange(0, T_K)
    d_ok = offs_d < D                                              # the padded feature columns load as 0
    visited = 0
    for start_n in range(start, stop, T_K):
        offs_k = start_n + offs_n
        kt_ptrs = K + offs_k[None, :] * stride_kn + offs_d[:, None]    # K^T tile [BLOCK_D, T_K]
        v_ptrs = V + offs_k[:, None] * stride_kn + offs_d[None, :]     # V tile [T_K, BLOCK_D]
        if MASKED:
            key_ok = offs_k < n_k
            kt = tl.load(kt_ptrs, mask=d_ok[:, None] & key_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        else:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        if MASKED:
            visible = key_ok[None, :]
            if CAUSAL:
                visible = visible & (offs_k[None, :] <= offs_m[:, None] + diag)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)      # the guard
        else:
            m_new = tl.maximum(m, tl.max(s, 1))
            m_sub = m_new
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m - m_sub)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
        visited += 1
    return acc, m, l, visited


@triton.jit
def flash_fwd(Q, K, V, O, LSE, VISITS, n_q, n_k, stride_qbh, stride_qm, stride_kbh, stride_kn, qk_scale,
              CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
              PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    O += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    m0 = pid_m * T_Q
    offs_m = m0 + tl.arange(0, T_Q)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    io_mask = row_ok[:, None] & (offs_d < D)[None, :]
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=io_mask, other=0.0)
    m = tl.full([T_Q], float("-inf"), dtype=tl.float32)
    l = tl.zeros([T_Q], dtype=tl.float32)
    acc = tl.zeros([T_Q, BLOCK_D], dtype=tl.float32)

    diag = n_k - n_q                                            # query i sees keys j <= i + diag
    if CAUSAL:
        full_stop = tl.minimum(tl.maximum(m0 + diag + 1, 0), n_k) // T_K * T_K
        masked_stop = tl.minimum(tl.maximum(m0 + T_Q + diag, 0), n_k)
    else:
        full_stop = n_k // T_K * T_K
        masked_stop = n_k
    acc, m, l, n_full = _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, 0, full_stop, n_k, diag,
                                        qk_scale, False, CAUSAL, D, T_K, PRECISION)
    acc, m, l, n_masked = _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, full_stop, masked_stop,
                                          n_k, diag, qk_scale, True, CAUSAL, D, T_K, PRECISION)

    seen = l > 0.0
    l_div = tl.where(seen, l, 1.0)
    o = acc / l_div[:, None]
    lse = tl.where(seen, (m + tl.math.log2(l_div)) * 0.6931471805599453, float("-inf"))
    tl.store(O + offs_m[:, None] * stride_qm + offs_d[None, :], o.to(O.dtype.element_ty), mask=io_mask)
    tl.store(LSE + pid_bh * n_q + offs_m, lse, mask=row_ok)
    visits = VISITS + (pid_bh * tl.num_programs(0) + pid_m) * 2
    tl.store(visits, n_full)
    tl.store(visits + 1, n_masked)


def attention_forward(q, k, v, T_q=16, T_k=16, causal=True, kernel=flash_fwd):
    """Attention, causal (bottom-right aligned) or not: ``(o, lse, visits)`` (see the exercise)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    q3, k3, v3 = (x.reshape(B * H, -1, D).contiguous() for x in (q, k, v))
    o3 = torch.empty_like(q3)
    lse = torch.empty(B * H, Nq, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(Nq, T_q), B * H)
    visits = torch.zeros(B * H, grid[0], 2, device=q.device, dtype=torch.int32)
    kernel[grid](q3, k3, v3, o3, lse, visits, Nq, Nk, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                 D ** -0.5 * LOG2E, CAUSAL=causal, D=D, BLOCK_D=max(16, triton.next_power_of_2(D)), T_Q=T_q,
                 T_K=T_k, PRECISION=precision(q.dtype))
    return o3.reshape(B, H, Nq, D), lse.reshape(B, H, Nq), visits


# Exercise 2: key tiles visited, and the causal / non-causal ratio.
def key_tiles_visited(n_q, n_k, T_q, T_k, causal):
    total = 0
    for m0 in range(0, n_q, T_q):
        if causal:
            last_row = min(m0 + T_q, n_q) - 1                        # the tile's last real query
            n_seen = min(max(last_row + (n_k - n_q) + 1, 0), n_k)    # it sees keys j < last_row + diag + 1
            total += triton.cdiv(n_seen, T_k)
        else:
            total += triton.cdiv(n_k, T_k)
    return total


def visited_ratio(N, T_q):
    # Query tile t (of n = N / T_q) visits (t + 1) * T_q / T_k key tiles; the sum over t is
    # (T_q / T_k) * n (n + 1) / 2, against n * N / T_k = (T_q / T_k) * n^2 without the mask.
    # T_q / T_k cancels, so T_k does not appear: the ratio (n + 1) / (2 n) = 1/2 + T_q / (2 N) exceeds 1/2 by
    # exactly T_q / (2 N): each query tile loads its whole diagonal T_q x T_q block, half of it past the diagonal.
    return 0.5 + T_q / (2 * N)


# Exercise 3: dS from the D term.
def ds_from_formula(s, v, do):
    p = torch.softmax(s, dim=-1)
    o = p @ v
    dp = do @ v.T
    d = (do * o).sum(dim=-1, keepdim=True)            # D_i = rowsum(dO * O)
    return p * (dp - d)

# Why not D_i = sum_j dP_ij: the softmax Jacobian subtracts the P-weighted mean of row i of dP,
# sum_j P_ij dP_ij = dO_i . O_i; the unweighted sum is a different number (and grows with N_k).


# Exercise 4: the backward's pre-pass D = rowsum(dO * O), one program per (row tile, batch x head).
@triton.jit
def rowsum_do_o_kernel(O, DO, DELTA, n, num_heads,
                       stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_n[:, None] < n) & (offs_d[None, :] < D)       # the row tail and the padded feature columns
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_n[:, None] * stride_on + offs_d[None, :],
                mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_n[:, None] * stride_don + offs_d[None, :],
                 mask=mask, other=0.0)
    tl.store(DELTA + pid_bh * n + offs_n, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_n < n)


def rowsum_do_o(o, do, block_n=16):
    B, H, N, D = o.shape
    o, do = (x if x.stride(-1) == 1 else x.contiguous() for x in (o, do))   # the kernel assumes unit stride on d
    delta = torch.empty(B, H, N, device=o.device, dtype=torch.float32)
    rowsum_do_o_kernel[(triton.cdiv(N, block_n), B * H)](
        o, do, delta, N, H, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        D=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_N=block_n)
    return delta


# Exercise 5: the dK/dV kernel, one program per key tile walking down the query tiles.
@triton.jit
def flash_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, n_q, n_k, scale, stride_qbh, stride_qm, stride_kbh, stride_kn,
               CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
               PRECISION: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    DO += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    DK += pid_bh * stride_kbh
    DV += pid_bh * stride_kbh
    LSE += pid_bh * n_q
    DELTA += pid_bh * n_q
    n0 = pid_n * T_K
    offs_n = n0 + tl.arange(0, T_K)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    kv_mask = (offs_n < n_k)[:, None] & d_ok[None, :]
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)   # loaded once
    v = tl.load(V + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([T_K, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([T_K, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634                         # base 2: exp(x) = exp2(x * log2(e))
    diag = n_k - n_q
    start = 0
    if CAUSAL:
        start = tl.maximum(n0 - diag, 0) // T_Q * T_Q           # query tiles above it see none of these keys
    for start_m in range(start, n_q, T_Q):
        offs_m = start_m + tl.arange(0, T_Q)
        row_ok = offs_m < n_q
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)                # [T_Q, T_K], unscaled
        p = tl.math.exp2(s * qk_scale - lse[:, None] * 1.4426950408889634)  # P = exp(S - lse): no max, no sum
        if CAUSAL:     # also a row that sees no key: lse = -inf makes exp2 +inf there
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, p, 0.0)
        # Rows past n_q (q, dO, D loaded as 0) add P^T 0 to dV and 0 to dS: no mask needed for them.
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tl.store(DK + offs_n[:, None] * stride_kn + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + offs_n[:, None] * stride_kn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


def attention_dkdv(q, k, v, do, lse, delta, causal, T_q=16, T_k=16, kernel=flash_dkdv):
    """``(dk, dv)`` from the forward's ``lse`` and the pre-pass's ``delta`` (see the exercise)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    q3, k3, v3, do3 = (x.reshape(B * H, -1, D).contiguous() for x in (q, k, v, do))
    dk3, dv3 = torch.empty_like(k3), torch.empty_like(v3)
    kernel[(triton.cdiv(Nk, T_k), B * H)](
        q3, k3, v3, do3, lse.contiguous(), delta.contiguous(), dk3, dv3, Nq, Nk, D ** -0.5,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), CAUSAL=causal, D=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), T_Q=T_q, T_K=T_k, PRECISION=precision(q.dtype))
    return dk3.reshape(B, H, Nk, D), dv3.reshape(B, H, Nk, D)


# Exercise 6: the dQ kernel, one program per query tile walking along the key tiles.
@triton.jit
def flash_dq(Q, K, V, DO, LSE, DELTA, DQ, n_q, n_k, scale, stride_qbh, stride_qm, stride_kbh, stride_kn,
             CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
             PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    DO += pid_bh * stride_qbh
    DQ += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    m0 = pid_m * T_Q
    offs_m = m0 + tl.arange(0, T_Q)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    d_ok = offs_d < D
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)    # loaded once
    do = tl.load(DO + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + pid_bh * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * n_q + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([T_Q, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634                         # base 2: exp(x) = exp2(x * log2(e))
    diag = n_k - n_q
    stop = n_k
    if CAUSAL:
        stop = tl.minimum(tl.maximum(m0 + T_Q + diag, 0), n_k)     # the keys its last row sees
    for start_n in range(0, stop, T_K):
        offs_n = start_n + tl.arange(0, T_K)
        kv_mask = (offs_n < n_k)[:, None] & d_ok[None, :]
        k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        p = tl.math.exp2(s * qk_scale - lse[:, None] * 1.4426950408889634)
        if CAUSAL:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, p, 0.0)
        # Keys past n_k (K, V loaded as 0) add dS 0 = 0 to dQ: no mask needed for them.
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + offs_m[:, None] * stride_qm + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


def attention_dq(q, k, v, do, lse, delta, causal, T_q=16, T_k=16, kernel=flash_dq):
    """``dq`` from the forward's ``lse`` and the pre-pass's ``delta`` (see the exercise)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    q3, k3, v3, do3 = (x.reshape(B * H, -1, D).contiguous() for x in (q, k, v, do))
    dq3 = torch.empty_like(q3)
    kernel[(triton.cdiv(Nq, T_q), B * H)](
        q3, k3, v3, do3, lse.contiguous(), delta.contiguous(), dq3, Nq, Nk, D ** -0.5,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), CAUSAL=causal, D=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), T_Q=T_q, T_K=T_k, PRECISION=precision(q.dtype))
    return dq3.reshape(B, H, Nq, D)

"""A probe, not package code: plain split-K decode whose splits hand the tail of their key range to whichever
program is free.

timeline.py found the split kernel's programs ending over 15-20 us at random, the kernel waiting for the last.
Here each program (split s of a (batch, kv head) pair) first streams the head of its split's key tiles, then takes
work items from a global atomic counter: the last K * C tiles of every split, cut into K chunks of C tiles. Each
chunk keeps its own (m, l, acc) slot, whoever computes it, and mta's merge kernel combines the S * (1 + K) slots of
a row in a fixed order, so the result is the same bitwise from run to run.

CPU (Triton's interpreter): `python steal_decode.py check`. GPU: `python steal_decode.py bench OUT.json`
(correctness against SDPA in fp32, bitwise repeat, then event timing beside decode_attention and SDPA).
One new query, every cache position valid (no lengths), one row tile per pair.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

import mta  # first: without a GPU it sets TRITON_INTERPRET before Triton is imported
import triton
import triton.language as tl
import mta.decode as dec
from mta.decode_kernels import decode_combine_kernel
from mta.kernel_parts import LOG2E, online_softmax_step


@triton.jit
def _stream(acc, m, l, q, k_base, v_base, stride_kn, stride_vn, offs_d, tile_start, tile_stop, seq_len, i, qk_scale,
            D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    for tile in range(tile_start, tile_stop):
        j = tile * BLOCK_N + offs_n
        ok = j < seq_len
        kt = tl.load(k_base + j[None, :] * stride_kn + offs_d[:, None], mask=d_ok[:, None] & ok[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION)
        s = tl.where(ok[None, :] & (j[None, :] <= i[:, None]), s * qk_scale, float("-inf"))
        v = tl.load(v_base + j[:, None] * stride_vn + offs_d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
        acc, m, l = online_softmax_step(acc, m, l, s, v, True, PRECISION)
    return acc, m, l


@triton.jit
def _pair_rows(pair, Q, K, V, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, num_heads,
               num_kv_heads, offs_d, D: tl.constexpr, BLOCK_M: tl.constexpr):
    b = pair // num_kv_heads
    kv_h = pair % num_kv_heads
    group = num_heads // num_kv_heads
    r = tl.arange(0, BLOCK_M)
    row_ok = r < group
    h = kv_h * group + r
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    k_base = K + b.to(tl.int64) * stride_kb + kv_h * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + kv_h * stride_vh
    return q, k_base, v_base, b * num_heads + h, row_ok


@triton.jit
def _store(M_PART, L_PART, ACC_PART, slot, rows_total, out_row, row_ok, m, l, acc, offs_d, D: tl.constexpr):
    row = slot * rows_total + out_row
    tl.store(M_PART + row, m, mask=row_ok)
    tl.store(L_PART + row, l, mask=row_ok)
    tl.store(ACC_PART + row.to(tl.int64)[:, None] * D + offs_d[None, :], acc,
             mask=row_ok[:, None] & (offs_d < D)[None, :])


@triton.jit
def steal_split_kernel(Q, K, V, M_PART, L_PART, ACC_PART, COUNTER, stride_qb, stride_qh, stride_kb, stride_kh,
                       stride_kn, stride_vb, stride_vh, stride_vn, n_keys, num_heads, num_kv_heads, num_splits,
                       chunks, chunk_tiles, scale, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    split = tl.program_id(0)
    pair = tl.program_id(1)
    pairs = tl.num_programs(1)
    rows_total = pairs // num_kv_heads * num_heads
    offs_d = tl.arange(0, BLOCK_D)
    qk_scale = scale * LOG2E
    i = tl.zeros([BLOCK_M], dtype=tl.int32) + (n_keys - 1)  # one new query: the last position
    n_tiles = tl.cdiv(n_keys, BLOCK_N)
    per = tl.cdiv(n_tiles, num_splits)
    tail = chunks * chunk_tiles
    # The head of this split: streamed by its own program.
    q, k_base, v_base, out_row, row_ok = _pair_rows(pair, Q, K, V, stride_qb, stride_qh, stride_kb, stride_kh,
                                                    stride_vb, stride_vh, num_heads, num_kv_heads, offs_d, D, BLOCK_M)
    start = split * per
    head_stop = tl.minimum(start + tl.maximum(per - tail, 0), n_tiles)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, m, l = _stream(acc, m, l, q, k_base, v_base, stride_kn, stride_vn, offs_d, start, head_stop, n_keys, i,
                        qk_scale, D, BLOCK_N, PRECISION)
    _store(M_PART, L_PART, ACC_PART, split, rows_total, out_row, row_ok, m, l, acc, offs_d, D)
    # The tails of all splits, chunk by chunk, to whoever asks first; chunk c keeps slot num_splits + c % (S K).
    items = pairs * num_splits * chunks
    item = tl.atomic_add(COUNTER, 1)
    while item < items:
        item_pair = item // (num_splits * chunks)
        item_split = item // chunks % num_splits
        chunk = item % chunks
        q, k_base, v_base, out_row, row_ok = _pair_rows(item_pair, Q, K, V, stride_qb, stride_qh, stride_kb,
                                                        stride_kh, stride_vb, stride_vh, num_heads, num_kv_heads,
                                                        offs_d, D, BLOCK_M)
        split_start = item_split * per
        split_stop = tl.minimum(split_start + per, n_tiles)
        base = split_start + tl.maximum(per - tail, 0)
        c0 = tl.minimum(base + chunk * chunk_tiles, split_stop)
        c1 = tl.minimum(c0 + chunk_tiles, split_stop)
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc, m, l = _stream(acc, m, l, q, k_base, v_base, stride_kn, stride_vn, offs_d, c0, c1, n_keys, i,
                            qk_scale, D, BLOCK_N, PRECISION)
        _store(M_PART, L_PART, ACC_PART, num_splits + item_split * chunks + chunk, rows_total, out_row, row_ok, m, l,
               acc, offs_d, D)
        item = tl.atomic_add(COUNTER, 1)


def steal_decode(q, k, v, num_splits, chunks, chunk_tiles, tile=None):
    """``q [B, Hq, 1, D]``, ``k, v [B, Hkv, N, D]`` (last dim contiguous) -> ``[B, Hq, 1, D]``."""
    B, Hq, n_new, D = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    assert n_new == 1 and k.stride(3) == 1 and v.stride(3) == 1 and q.stride(3) == 1
    block_d = max(16, triton.next_power_of_2(D))
    block_n, warps, stages = tile or dec.decode_tile(block_d, k.dtype)
    block_m = max(16, triton.next_power_of_2(Hq // Hkv))
    slots = num_splits * (1 + chunks)
    rows = B * Hq
    m_part, l_part, acc_part = dec.split_states(slots, rows, D, k.device)
    counter = torch.zeros(1, dtype=torch.int32, device=k.device)
    o = torch.empty_like(q)
    dec.launch(steal_split_kernel, (num_splits, B * Hkv), q, k, v, m_part, l_part, acc_part, counter, q.stride(0),
               q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), N, Hq, Hkv,
               num_splits, chunks, chunk_tiles, D ** -0.5, D=D, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
               PRECISION=mta.launch.dot_precision(k.dtype), num_warps=warps, num_stages=stages)
    dec.launch(decode_combine_kernel, (rows,), m_part, l_part, acc_part, o, *o.stride(), 1, Hq, slots, D=D,
               BLOCK_D=block_d, BLOCK_S=dec.COMBINE_BLOCK_S, PDL=False, num_warps=1 if block_d <= 64 else 2)
    return o


def reference(q, k, v):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=q.shape[1] != k.shape[1])


def check_cpu():
    torch.manual_seed(0)
    for B, Hq, Hkv, N, D, S, K, C in ((2, 4, 2, 300, 16, 3, 2, 1), (1, 2, 2, 37, 16, 2, 1, 1), (2, 8, 2, 129, 32, 1, 3, 2),
                                      (1, 2, 1, 1, 16, 4, 2, 1), (3, 2, 2, 520, 24, 5, 2, 3)):
        q, k, v = torch.randn(B, Hq, 1, D), torch.randn(B, Hkv, N, D), torch.randn(B, Hkv, N, D)
        o = steal_decode(q, k, v, S, K, C)
        err = (o - reference(q, k, v)).abs().max().item()
        same = torch.equal(o, steal_decode(q, k, v, S, K, C))
        print(f"B{B} Hq{Hq} Hkv{Hkv} N{N} D{D} S{S} K{K} C{C}: max error {err:.2e}, repeat bitwise {same}")
        assert err < 1e-5 and same


def bench(out):
    from mta.bench.timing import time_ms
    dev = torch.device("cuda")
    rows = []
    for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 32768), (8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072),
                             (8, 32, 8, 128, 32768), (16, 8, 8, 64, 65536)):
        q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
        ref = reference(q, k, v)
        splits = dec.choose_num_splits(B * Hkv, N, dec.decode_tile(max(16, triton.next_power_of_2(D)), k.dtype)[0],
                                       dec.sm_count(dev))
        variants = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv),
                    "decode_attention": lambda: mta.decode_attention(q, k, v)}
        for K, C in ((1, 4), (2, 2), (2, 4), (4, 2), (4, 4), (8, 2)):
            variants[f"steal S={splits} K={K} C={C}"] = lambda K=K, C=C: steal_decode(q, k, v, splits, K, C)
        for name, fn in variants.items():
            o = fn()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            same = torch.equal(o, fn())
            us = [time_ms(fn, warmup=5, rep=40) * 1e3 for _ in range(2)]
            rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, impl=name, us=us, rel_err=err, bitwise_repeat=same))
            print(f"B{B} Hq{Hq} d{D} N{N} {name:24s} {us[0]:7.1f} {us[1]:7.1f} us  err {err:.1e} repeat {same}",
                  flush=True)
        del q, k, v
    json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    check_cpu() if sys.argv[1] == "check" else bench(sys.argv[2])

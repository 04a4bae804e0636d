# python notes/h100_2026-11-25i/dq_phase1_forward_tiles.py OUT.json   (GPU; from the repository root)
"""Issue 12, d = 128, the next question after dq_two_phase.py: can a two-phase dQ side's phase 1 make C at the
forward's rate? A probe kernel built from the forward's own pieces (mta.conv_forward: its folded scores, streamed
through TMA at d = 128 in the forward's tile) that, instead of the online softmax, makes P from the saved lse,
dP = dO V^T, dC = P (dP - Delta), keeps the far entries on diagonal tiles and stores dC (bf16) to an N x N scratch.
Timed against the forward kernel and the shipped dQ kernel (relaunched with captured arguments); phase 2
(Gq = dC Kf, one full batched GEMM) checked against the shipped Gq. bf16, causal, 6 x 11, B = 1, N = 8192."""
import json
import sys

import torch

import mta  # before triton: sets TRITON_INTERPRET=1 where there is no GPU
import mta.conv_forward as cf
import triton
import triton.language as tl
import mta.launch as ml
from mta.bench.timing import time_ms
from mta.conv_forward import _finish_scores, _folded_scores, _shifted_queries
from mta.kernel_parts import LOG2E, key_tile_bounds, program_coordinates


@triton.jit
def _dc_tiles(do, lse2, delta, dcs_base, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa,
              stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, b, h, kv_h, i0, offs_m, offs_d, cd_base,
              start, stop, n, qk_scale, MASKED: tl.constexpr, DIAGONAL: tl.constexpr, RESIDENT: tl.constexpr,
              TMA: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr, E: tl.constexpr,
              E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, WIDTH: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(start, stop, BLOCK_N, flatten=TMA):
        offs_k = start_n + offs_n
        c = _folded_scores(q_hi, q_lo, q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                              QD, KFD, b, h, i0, start_n, offs_m, offs_k, n, RESIDENT, TMA, CQ, QA, QB, D, BLOCK_D,
                              WIDTH, BLOCK_M, BLOCK_N, PRECISION)
        c = _finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, E, E_PAD)
        k_ok = offs_k < n
        if MASKED or DIAGONAL:
            c = tl.where(k_ok[None, :], c, float("-inf"))
        if TMA:
            v = VD.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=k_ok[:, None] & (offs_d < D)[None, :], other=0.0)
        p = tl.math.exp2(c - lse2[:, None])
        dc = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        if DIAGONAL:
            dc = tl.where(offs_m[:, None] - offs_k[None, :] >= E, dc, 0.0)
        tl.store(dcs_base + offs_m[:, None].to(tl.int64) * n + offs_k[None, :], dc.to(v.dtype),
                 mask=(offs_m < n)[:, None] & k_ok[None, :])


@triton.heuristics(cf.HEURISTICS)
@triton.jit
def dc_phase1_kernel(DCS, DO, DELTA, Q, KF, V, CD, O, LSE, QD, KFD, VD,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                     stride_ob, stride_oh, stride_om, stride_od,
                     n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                     CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                     E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr,
                     RESIDENT: tl.constexpr, TMA: tl.constexpr, WIDTH: tl.constexpr):
    n = n_q
    pid_m, pid_bh, b, h, kv_h = program_coordinates(num_heads, group_size, HEAVY_LAST=True)
    i0 = pid_m * BLOCK_M
    offs_m = i0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n
    q_base = Q + b * stride_qb + h * stride_qh
    v_base = V + b * stride_vb + kv_h * stride_vh
    kf_base = KF + b * stride_kfb + h * stride_kfh
    cd_base = CD + pid_bh * n * E_PAD
    b32, h32, kv_h32 = b.to(tl.int32), h.to(tl.int32), kv_h.to(tl.int32)
    qk_scale = scale * LOG2E
    if RESIDENT:
        q_hi = _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, 0, QA, CQ, D, BLOCK_D)
        if QB > 0:
            q_lo = _shifted_queries(q_base, stride_qm, stride_qd, offs_m, n, QA, QB, CQ, D, BLOCK_D)
        else:
            q_lo = q_hi
    else:
        q_hi = 0.0
        q_lo = 0.0
    do = tl.load(DO + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                 mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    lse2 = tl.load(LSE + pid_bh * n + offs_m, mask=row_ok, other=float("inf")) * LOG2E
    delta = tl.load(DELTA + pid_bh * n + offs_m, mask=row_ok, other=0.0)
    dcs_base = DCS + pid_bh.to(tl.int64) * n * n
    full_stop, masked_stop = key_tile_bounds(i0, n, 0, E, CAUSAL, BLOCK_M, BLOCK_N)
    _dc_tiles(do, lse2, delta, dcs_base, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa,
              stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, b32, h32, kv_h32, i0, offs_m, offs_d,
              cd_base, 0, full_stop, n, qk_scale, False, False, RESIDENT, TMA, CQ, QA, QB, E, E_PAD, D, BLOCK_D,
              WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    _dc_tiles(do, lse2, delta, dcs_base, q_hi, q_lo, q_base, kf_base, v_base, stride_qm, stride_qd, stride_kfa,
              stride_kfn, stride_kfd, stride_vn, stride_vd, QD, KFD, VD, b32, h32, kv_h32, i0, offs_m, offs_d,
              cd_base, full_stop, masked_stop, n, qk_scale, not CAUSAL, CAUSAL, RESIDENT, TMA, CQ, QA, QB, E,
              E_PAD, D, BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)


captured = {}
orig_launch = ml.launch


def kernel_name(kernel):
    while not hasattr(kernel, "__name__") and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return getattr(kernel, "__name__", "")


def capturing_launch(kernel, grid, *args, **meta):
    name = kernel_name(kernel)
    if name in ("conv_forward_kernel", "conv_dq_kernel") and name not in captured and not ml.in_dry_run():
        captured[name] = (kernel, grid, args, dict(meta))
    return orig_launch(kernel, grid, *args, **meta)


ml.launch = capturing_launch
on_gpu = torch.cuda.is_available()
dev = torch.device("cuda" if on_gpu else "cpu")
dt = torch.bfloat16 if on_gpu else torch.float32
rows = []
for H, D, N in (((16, 128, 8192), (8, 64, 8192)) if on_gpu else ((2, 16, 70),)):
    captured.clear()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=dt)
    mta.conv_attention(q, k, v, w, causal=True).backward(do)
    fkernel, fgrid, fargs, fmeta = captured["conv_forward_kernel"]
    qkernel, qgrid, qargs, qmeta = captured["conv_dq_kernel"]
    Q, KF, V, CD, O, LSE = fargs[:6]
    GQ, DELTA_shipped = qargs[7], qargs[5]
    gq_ref = GQ.clone()
    dcs = torch.zeros(H, N, N, device=dev, dtype=dt)
    tile = {k_: fmeta.get(k_) for k_ in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
    print(f"H={H} d={D}: forward grid {fgrid} tile {tile}", flush=True)
    p1 = lambda: orig_launch(dc_phase1_kernel, fgrid, dcs, do, DELTA_shipped, *fargs, **fmeta)
    p1()
    kf_cols = KF[0].permute(0, 2, 1, 3).reshape(H, N, -1)
    gq2 = torch.matmul(dcs, kf_cols)
    ref = gq_ref[0].permute(0, 2, 1, 3).reshape(H, N, -1).float()
    err = ((gq2.float() - ref).norm() / ref.norm()).item()
    r = dict(H=H, D=D, N=N, forward_tile=tile, gq_rel_err=err)
    if on_gpu:
        r["forward_ms"] = time_ms(lambda: orig_launch(fkernel, fgrid, *fargs, **fmeta), warmup=3, rep=10)
        r["shipped_dq_ms"] = time_ms(lambda: orig_launch(qkernel, qgrid, *qargs, **qmeta), warmup=3, rep=10)
        r["phase1_forward_tile_ms"] = time_ms(p1, warmup=3, rep=10)
        r["phase2_full_gemm_ms"] = time_ms(lambda: torch.matmul(dcs, kf_cols), warmup=3, rep=10)
    rows.append(r)
    print(json.dumps(r), flush=True)
    del dcs, gq2, q, k, v
if on_gpu:
    json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

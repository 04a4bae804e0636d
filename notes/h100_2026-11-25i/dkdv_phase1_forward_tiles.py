# python notes/h100_2026-11-25i/dkdv_phase1_forward_tiles.py OUT.json   (GPU; from the repository root)
"""Issue 12, d = 128, the dK/dV side of the two-phase idea (after dq_phase1_forward_tiles.py): a program owns a key
tile and walks the query tiles from the diagonal on, making C with the forward's pieces (the score product's depth
through TMA), P from the saved lse, dV += P^T dO, dP, dC (far entries on diagonal tiles) stored (bf16) to an N x N
scratch; phase 2, U = dC^T Qshift for all shifts, one full batched GEMM. Timed against the shipped dK/dV kernel
(relaunched with captured arguments); dV against the shipped gradient and U against the shipped U. bf16, causal,
6 x 11, B = 1, H = Hkv, N = 8192; several tiles."""
import json
import sys

import torch

import mta  # before triton: sets TRITON_INTERPRET=1 where there is no GPU
import mta.conv_forward as cf
import triton
import triton.language as tl

import mta.launch as ml
from mta.conv_forward import _finish_scores, _folded_scores
from mta.kernel_parts import LOG2E
from mta.launch import cdiv


@triton.jit
def _query_tiles(dv, v, dcs_base, q_base, kf_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_kfa,
                 stride_kfn, stride_kfd, stride_dom, stride_dod, QD, KFD, b, h, j0, offs_k, offs_d, cd_base, start,
                 stop, n, qk_scale, DIAGONAL: tl.constexpr, TMA: tl.constexpr, CQ: tl.constexpr, QA: tl.constexpr,
                 QB: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    k_ok = offs_k < n
    for i0 in tl.range(start, stop, BLOCK_M, flatten=TMA):
        offs_m = i0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n
        c = _folded_scores(0.0, 0.0, q_base, kf_base, stride_qm, stride_qd, stride_kfa, stride_kfn, stride_kfd,
                           QD, KFD, b, h, i0, j0, offs_m, offs_k, n, False, TMA, CQ, QA, QB, D, BLOCK_D,
                           WIDTH, BLOCK_M, BLOCK_N, PRECISION)
        c = _finish_scores(c, cd_base, offs_m, offs_k, n, qk_scale, DIAGONAL, E, E_PAD)
        c = tl.where(k_ok[None, :], c, float("-inf"))
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
        p = tl.math.exp2(c - lse2[:, None])
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision=PRECISION)
        dc = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        if DIAGONAL:
            dc = tl.where(offs_m[:, None] - offs_k[None, :] >= E, dc, 0.0)
        tl.store(dcs_base + offs_m[:, None].to(tl.int64) * n + offs_k[None, :], dc.to(do.dtype),
                 mask=row_ok[:, None] & k_ok[None, :])
    return dv


@triton.heuristics(cf.HEURISTICS)
@triton.jit
def dkdv_phase1_kernel(DCS, DVO, DO, DELTA, Q, KF, V, CD, O, LSE, QD, KFD, VD,
                       stride_qb, stride_qh, stride_qm, stride_qd,
                       stride_vb, stride_vh, stride_vn, stride_vd,
                       stride_kfb, stride_kfh, stride_kfa, stride_kfn, stride_kfd,
                       stride_ob, stride_oh, stride_om, stride_od,
                       n_q, n_k, num_heads, group_size, scale, N_BUCKET,
                       CAUSAL: tl.constexpr, CQ: tl.constexpr, CK: tl.constexpr, E: tl.constexpr,
                       E_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QA: tl.constexpr, QB: tl.constexpr,
                       RESIDENT: tl.constexpr, TMA: tl.constexpr, WIDTH: tl.constexpr):
    """Grid (cdiv(n, BLOCK_N), B * H), H = Hkv (no groups in this probe), causal only."""
    n = n_q
    j0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_N  # heaviest (first) key tiles first
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_k = j0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_ok = offs_k < n
    q_base = Q + b * stride_qb + h * stride_qh
    kf_base = KF + b * stride_kfb + h * stride_kfh
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_k[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=k_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    do_base = DO + b * stride_ob + h * stride_oh
    cd_base = CD + pid_bh * n * E_PAD
    dcs_base = DCS + pid_bh.to(tl.int64) * n * n
    qk_scale = scale * LOG2E
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    b32, h32 = b.to(tl.int32), h.to(tl.int32)
    # query tiles touching the keys' near band (i - j < E for some pair): DIAGONAL; the rest folded only
    first = j0 // BLOCK_M * BLOCK_M
    near_stop = tl.minimum(cdiv_(j0 + BLOCK_N - 1 + E, BLOCK_M) * BLOCK_M, cdiv_(n, BLOCK_M) * BLOCK_M)
    dv = _query_tiles(dv, v, dcs_base, q_base, kf_base, do_base, LSE + pid_bh * n, DELTA + pid_bh * n, stride_qm,
                      stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_om, stride_od, QD, KFD, b32, h32, j0,
                      offs_k, offs_d, cd_base, first, near_stop, n, qk_scale, True, TMA, CQ, QA, QB, E, E_PAD, D,
                      BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    dv = _query_tiles(dv, v, dcs_base, q_base, kf_base, do_base, LSE + pid_bh * n, DELTA + pid_bh * n, stride_qm,
                      stride_qd, stride_kfa, stride_kfn, stride_kfd, stride_om, stride_od, QD, KFD, b32, h32, j0,
                      offs_k, offs_d, cd_base, near_stop, n, n, qk_scale, False, TMA, CQ, QA, QB, E, E_PAD, D,
                      BLOCK_D, WIDTH, BLOCK_M, BLOCK_N, PRECISION)
    tl.store(DVO + pid_bh.to(tl.int64) * n * D + offs_k[:, None] * D + offs_d[None, :], dv,
             mask=k_ok[:, None] & (offs_d < D)[None, :])


@triton.jit
def cdiv_(a, b):
    return (a + b - 1) // b


captured = {}
orig_launch = ml.launch


def kernel_name(kernel):
    while not hasattr(kernel, "__name__") and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return getattr(kernel, "__name__", "")


def capturing_launch(kernel, grid, *args, **meta):
    name = kernel_name(kernel)
    if name in ("conv_forward_kernel", "conv_dkdv_kernel") and name not in captured and not ml.in_dry_run():
        captured[name] = (kernel, grid, args, dict(meta))
    return orig_launch(kernel, grid, *args, **meta)


ml.launch = capturing_launch
on_gpu = torch.cuda.is_available()
dev = torch.device("cuda" if on_gpu else "cpu")
dt = torch.bfloat16 if on_gpu else torch.float32
H, D, N = (16, 128, 8192) if on_gpu else (2, 16, 70)
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
do = torch.randn(1, H, N, D, device=dev, dtype=dt)
mta.conv_attention(q, k, v, w, causal=True).backward(do)
fkernel, fgrid, fargs, fmeta = captured["conv_forward_kernel"]
kkernel, kgrid, kargs, kmeta = captured["conv_dkdv_kernel"]
Q, KF, V, CD, O, LSE = fargs[:6]
U, DELTA = kargs[7], kargs[5]
u_ref = U.clone()
cq = KF.shape[2]
qs = torch.zeros(H, N, cq, D, device=dev, dtype=dt)  # qs[h, i, a] = q[i - (cq-1) + a]
for a in range(cq):
    s = cq - 1 - a
    qs[:, s:, a] = q.detach()[0, :, :N - s]
qs = qs.reshape(H, N, cq * D)
rows = []
tiles = ([(128, 128, 8, 3), (64, 128, 8, 2)] if on_gpu
         else [(fmeta["BLOCK_M"], fmeta["BLOCK_N"], fmeta["num_warps"], fmeta["num_stages"])])
r = dict(H=H, D=D, N=N, forward_tile={k_: fmeta.get(k_) for k_ in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")},
         shipped_dkdv_tile={k_: kmeta.get(k_) for k_ in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}, phase1={})
if on_gpu:
    from mta.bench.timing import time_ms
    r["shipped_dkdv_ms"] = time_ms(lambda: orig_launch(kkernel, kgrid, *kargs, **kmeta), warmup=3, rep=10)
for bm, bn, warps, stages in tiles:
    meta = {**fmeta, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
    cf.fit_stream_descriptors(dict(zip(fkernel.arg_names if hasattr(fkernel, "arg_names") else [], fargs)) | meta
                              | {"QD": fargs[6], "KFD": fargs[7], "VD": fargs[8]})
    dcs = torch.zeros(H, N, N, device=dev, dtype=dt)
    dvo = torch.zeros(H, N, D, device=dev, dtype=torch.float32)
    grid = (cdiv(N, bn), H)
    p1 = lambda: orig_launch(dkdv_phase1_kernel, grid, dcs, dvo, do, DELTA, *fargs, **meta)
    name = f"{bm}x{bn}_w{warps}_s{stages}"
    try:
        p1()
        u2 = torch.matmul(dcs.transpose(1, 2), qs)  # [H, N, cq*D]
        uref = u_ref[0].permute(0, 2, 1, 3).reshape(H, N, cq * D).float()
        u_err = ((u2.float() - uref).norm() / uref.norm()).item()
        dv_err = ((dvo - v.grad[0].float()).norm() / v.grad[0].float().norm()).item()
        res = dict(u_rel_err=u_err, dv_rel_err=dv_err)
        if on_gpu:
            res["phase1_ms"] = time_ms(p1, warmup=3, rep=10)
            res["phase2_full_gemm_ms"] = time_ms(lambda: torch.matmul(dcs.transpose(1, 2), qs), warmup=3, rep=10)
        r["phase1"][name] = res
    except Exception as e:  # noqa: BLE001
        r["phase1"][name] = f"{type(e).__name__}: {str(e)[:200]}"
    print(name, r["phase1"][name], flush=True)
    del dcs, dvo
rows.append(r)
print(json.dumps(r), flush=True)
if on_gpu:
    json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

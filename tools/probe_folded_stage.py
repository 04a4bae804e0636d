"""GPU probe: the folded stage of the MTA forward alone, five ways to feed it shifted queries (d = 128).

    PYTHONPATH=. python tools/probe_folded_stage.py          # CFGS='[(BM, BN, warps, stages), ...]' MODES='[0, 3]'

Each program owns BLOCK_M query rows and walks the key tiles left of its block
(no diagonal stage, no pre-pass: folded keys are random), H=16, N=8192, d=128,
cq=6, bf16. Timing is what the probe is for; modes 0, 2, 3 and 4 compute the
same thing (the "maxdiff" column), mode 1 uses 123-row output tiles.

MODE 0: each shifted query tile loaded (cp.async, L2) for every key tile: mta's streamed path
MODE 1: one 128-row query tile held in registers, shifted tiles by tl.gather
MODE 2: shifted tiles by plain (L1-cached, not pipelined) loads
MODE 3: mode 0 with tl.range(flatten=True) over the key loop
MODE 4: mode 0 as one flat loop over (key tile, shift) pairs
Raw outputs: notes/h200_conv_probe.txt, run 7.
"""
import os
import time

import torch
import triton
import triton.language as tl

import mta
from mta.bench.timing import time_ms


@triton.jit
def fold_stage_kernel(Q, KF, V, O, stride_qh, stride_qm, stride_fh, stride_fa, stride_fn, stride_vh, stride_vn,
                      n, qk_scale, MODE: tl.constexpr, CQ: tl.constexpr, D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OUT_M: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    i0 = pid * OUT_M - (BLOCK_M - OUT_M)  # first row of the tile (halo rows first when OUT_M < BLOCK_M)
    offs_r = tl.arange(0, BLOCK_M)
    offs_m = i0 + offs_r
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    q_base = Q + h * stride_qh
    kf_base = KF + h * stride_fh
    v_base = V + h * stride_vh
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if MODE == 1:
        q_ext = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :],
                        mask=((offs_m >= 0) & (offs_m < n))[:, None], other=0.0)
    stop = tl.maximum(i0 + BLOCK_M - OUT_M, 0) // BLOCK_N * BLOCK_N
    if MODE == 4:  # one flat loop over (key tile, shift) pairs
        c = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for it in range(0, stop // BLOCK_N * CQ):
            a = it % CQ
            start_n = it // CQ * BLOCK_N
            offs_k = start_n + offs_n
            rows = offs_m - (CQ - 1) + a
            q_a = tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :],
                          mask=((rows >= 0) & (rows < n))[:, None], other=0.0)
            kf_t = tl.load(kf_base + a * stride_fa + offs_k[None, :] * stride_fn + offs_d[:, None])
            c = tl.dot(q_a, kf_t, c)
            if a == CQ - 1:
                cs = c * qk_scale
                v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :])
                m_new = tl.maximum(m, tl.max(cs, 1))
                p = tl.math.exp2(cs - m_new[:, None])
                alpha = tl.math.exp2(m - m_new)
                l = l * alpha + tl.sum(p, 1)
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
                m = m_new
                c = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        stop = 0
    for start_n in tl.range(0, stop, BLOCK_N, flatten=MODE == 3):
        offs_k = start_n + offs_n
        c = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for a in range(CQ):
            if MODE == 0 or MODE >= 3:
                rows = offs_m - (CQ - 1) + a
                q_a = tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :],
                              mask=((rows >= 0) & (rows < n))[:, None], other=0.0)
            elif MODE == 2:  # L1-cached plain load, masked after the load (so it is not an async copy)
                rows = offs_m - (CQ - 1) + a
                ok_r = (rows >= 0) & (rows < n)
                q_a = tl.load(q_base + tl.where(ok_r, rows, 0)[:, None] * stride_qm + offs_d[None, :],
                              cache_modifier=".ca")
                q_a = tl.where(ok_r[:, None], q_a, 0.0)
            else:
                src = tl.minimum(tl.maximum(offs_r - (CQ - 1) + a, 0), BLOCK_M - 1)
                q_a = tl.gather(q_ext, tl.broadcast_to(src[:, None], (BLOCK_M, D)), 0)
            kf_t = tl.load(kf_base + a * stride_fa + offs_k[None, :] * stride_fn + offs_d[:, None])
            c = tl.dot(q_a, kf_t, c)
        c = c * qk_scale
        v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :])
        m_new = tl.maximum(m, tl.max(c, 1))
        p = tl.math.exp2(c - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    ok = (offs_r >= BLOCK_M - OUT_M) & (offs_m < n)
    o = acc / l[:, None]
    tl.store(O + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=ok[:, None])


def launch(q, kf, v, mode, bm=128, bn=128, warps=8, stages=2, cq=6):
    H, N, D = q.shape
    out_m = bm - (cq - 1) if mode == 1 else bm
    o = torch.zeros_like(q)
    fold_stage_kernel[(triton.cdiv(N + bm - out_m, out_m), H)](
        q, kf, v, o, q.stride(0), q.stride(1), kf.stride(0), kf.stride(1), kf.stride(2), v.stride(0), v.stride(1),
        N, 0.125 * 1.4426950408889634, MODE=mode, CQ=cq, D=D, BLOCK_M=bm, BLOCK_N=bn, OUT_M=out_m,
        num_warps=warps, num_stages=stages)
    return o



def main():
    torch.manual_seed(0)
    H, N, D, cq = 16, 8192, 128, 6
    q, v = (torch.randn(H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kf = (torch.randn(H, cq, N, D, device="cuda") * 0.3).to(torch.bfloat16)
    t_flash = time_ms(lambda: mta.flash_attention(q[None], q[None], v[None], causal=True))
    print(f"flash {t_flash:.3f} ms", flush=True)
    cfgs = eval(os.environ.get("CFGS", "[(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3)]"))
    modes = eval(os.environ.get("MODES", "[0, 1, 2, 3, 4]"))
    for cfg in cfgs:
        base = None
        for mode in modes:
            try:
                t0 = time.time()
                o = launch(q, kf, v, mode, *cfg)
                torch.cuda.synchronize()
                comp = time.time() - t0
                err = float("nan")
                if mode != 1:
                    base = o if base is None else base
                    ok = torch.isfinite(base).all(-1)  # rows with no key tile before them are 0/0
                    err = (o.float() - base.float())[ok].abs().max().item()
                t = time_ms(lambda: launch(q, kf, v, mode, *cfg), warmup=3, rep=10)
                print(f"mode {mode} cfg {cfg}: {t:.3f} ms ({t / t_flash:.2f}x flash) maxdiff {err:.1e} "
                      f"compile {comp:.1f}s", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"mode {mode} cfg {cfg}: FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()

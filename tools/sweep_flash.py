"""Time every tuning candidate of the flash kernels on one shape set (GPU only).

Usage on the GPU machine: PYTHONPATH=. python3 tools/sweep_flash.py fwd|bwd [N,...] [D,...]
Writes $OUT/sweep_<fwd|bwd>.txt; the fastest candidates go into mta/tuning.py.
"""
import itertools, math, sys, time, json, os
import torch, triton
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
import mta
from mta import flash
from mta.flash_forward import flash_forward_kernel
from mta.flash_backward import flash_dkdv_kernel, flash_dq_kernel

which = sys.argv[1] if len(sys.argv) > 1 else "fwd"
Ns = [int(x) for x in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["4096"])]
Ds = [int(x) for x in (sys.argv[3].split(",") if len(sys.argv) > 3 else ["64", "128"])]
out = open(os.path.join(os.environ.get("OUT", "/tmp"), f"sweep_{which}.txt"), "a")
def log(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); out.write(s + "\n"); out.flush()

def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

dt = torch.bfloat16
# The candidates swept (wider than the lists mta.tuning keeps).
SWEEP_FORWARD = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
                 for bm, bn in ((128, 64), (128, 128), (64, 64)) for w in (4, 8) for st in (2, 3)]
SWEEP_BACKWARD = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
                  for bm, bn in ((32, 128), (64, 128), (64, 64), (128, 64)) for w in (4, 8) for st in (2, 3)]
for N, D, causal in itertools.product(Ns, Ds, (False, True)):
    B, H = 16384 // N, 2048 // D
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
    do = torch.randn_like(q)
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    scale = D ** -0.5
    ref = None
    for name, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(be):
                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o = f(); ref = o if ref is None else ref
                tf = bench(f)
                qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
                def fb():
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal); o.backward(do)
                tb = bench(fb) - tf
            log(f"N={N} D={D} causal={causal} {name}: fwd {flops/tf/1e9:.0f} TFLOPS bwd {2.5*flops/tb/1e9:.0f} TFLOPS")
        except Exception as e:
            log(f"{name} failed: {e!r}"[:200])
    Bq = flash.head_dim_block(D)
    o = torch.empty_like(q); lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    args_f = (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), N, N, H, 1, scale, N)
    res = []
    if which == "fwd":
        for c in SWEEP_FORWARD:
            bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            grid = (triton.cdiv(N, bm), B * H)
            try:
                t0 = time.time()
                run = lambda: flash_forward_kernel.fn[grid](*args_f, CAUSAL=causal, D=D, BLOCK_D=Bq, PRECISION="tf32",
                                                           BLOCK_M=bm, BLOCK_N=bn, num_warps=c.num_warps, num_stages=c.num_stages)
                run(); torch.cuda.synchronize(); tc = time.time() - t0
                err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                t = bench(run)
                res.append((flops / t / 1e9, bm, bn, c.num_warps, c.num_stages, err, tc))
            except Exception as e:
                res.append((0, bm, bn, c.num_warps, c.num_stages, repr(e)[:80], 0))
    else:
        o, lse = flash.flash_forward(q, k, v, causal, scale)
        delta = (o.float() * do.float()).sum(-1)
        dq = torch.empty_like(q); dk = torch.empty_like(k); dv = torch.empty_like(v)
        for c in SWEEP_BACKWARD:
            bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            try:
                t0 = time.time()
                r1 = lambda: flash_dkdv_kernel.fn[(triton.cdiv(N, bn), B * H)](q, k, v, do, lse, delta, dk, dv,
                    *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), N, N, H, 1, scale, N,
                    CAUSAL=causal, D=D, BLOCK_D=Bq, PRECISION="tf32", BLOCK_M=bm, BLOCK_N=bn, num_warps=c.num_warps, num_stages=c.num_stages)
                r2 = lambda: flash_dq_kernel.fn[(triton.cdiv(N, bm), B * H)](q, k, v, do, lse, delta, dq,
                    *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), N, N, H, 1, scale, N,
                    CAUSAL=causal, D=D, BLOCK_D=Bq, PRECISION="tf32", BLOCK_M=bm, BLOCK_N=bn, num_warps=c.num_warps, num_stages=c.num_stages)
                r1(); r2(); torch.cuda.synchronize(); tc = time.time() - t0
                t1, t2 = bench(r1), bench(r2)
                res.append((2.5 * flops / (t1 + t2) / 1e9, bm, bn, c.num_warps, c.num_stages, f"dkdv {t1:.3f}ms dq {t2:.3f}ms", tc))
            except Exception as e:
                res.append((0, bm, bn, c.num_warps, c.num_stages, repr(e)[:80], 0))
    res.sort(key=lambda r: -r[0])
    for r in res:
        log(f"  {which} N={N} D={D} causal={causal} BM={r[1]} BN={r[2]} w={r[3]} s={r[4]}: {r[0]:.0f} TFLOPS  ({r[5]}) compile {r[6]:.1f}s")

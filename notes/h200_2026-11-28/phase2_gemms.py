# python notes/h200_2026-11-28/phase2_gemms.py OUT.json   (GPU; from the repository root)
"""Issue 12, d = 128: what phase 2 of a row-chunked two-phase backward would cost through cuBLAS.

A phase 1 (Triton, the forward's tiles) would store, for a chunk of R query rows of every head, dC and P (bf16,
[B*H, R, keys up to the chunk's end]); phase 2 then makes, per chunk:
  Gq_a[rows]  = dC @ Kf_a            (one GEMM of width cq*D, written once: no accumulation)
  U_a[keys]  += dC^T @ Qshift_a       (accumulated over the chunks in fp32)
  dV[keys]   += P^T @ dO              (likewise)
Timed here on random data of the bench's shape (bf16, causal, H = 16, D = 128, N = 8192, cq = 6), for R = 1024 and
2048, with the fp32 accumulation done by baddbmm(out_dtype=float32) where torch has it, else a bf16 product added
to the fp32 buffer."""
import json
import sys

import torch

from mta.bench.timing import time_ms

dev = torch.device("cuda")
torch.manual_seed(0)
BH, N, D, CQ = 16, 8192, 128, 6
kf = torch.randn(BH, N, CQ * D, device=dev, dtype=torch.bfloat16)
qs = torch.randn(BH, N, CQ * D, device=dev, dtype=torch.bfloat16)
do = torch.randn(BH, N, D, device=dev, dtype=torch.bfloat16)
rows = {"gpu": torch.cuda.get_device_name()}
try:  # does baddbmm take out_dtype on this build (bf16 inputs, fp32 accumulator)?
    a = torch.randn(2, 64, 64, device=dev, dtype=torch.bfloat16)
    r = torch.baddbmm(torch.zeros(2, 64, 64, device=dev), a, a, out_dtype=torch.float32)
    rows["baddbmm_out_dtype"] = str(r.dtype)
    ref = torch.bmm(a.float(), a.float())
    rows["baddbmm_out_dtype_err"] = ((r - ref).norm() / ref.norm()).item()
except Exception as e:  # noqa: BLE001
    rows["baddbmm_out_dtype"] = f"{type(e).__name__}: {str(e)[:160]}"
has_out_dtype = rows["baddbmm_out_dtype"] == "torch.float32"
for R in (1024, 2048):
    dc = torch.randn(BH, R, N, device=dev, dtype=torch.bfloat16)
    p = torch.rand(BH, R, N, device=dev, dtype=torch.bfloat16)
    gq = torch.empty(BH, N, CQ * D, device=dev, dtype=torch.bfloat16)
    u = torch.zeros(BH, N, CQ * D, device=dev, dtype=torch.float32)
    dv = torch.zeros(BH, N, D, device=dev, dtype=torch.float32)
    chunks = [(r0, r0 + R) for r0 in range(0, N, R)]

    def gq_all():
        for r0, r1 in chunks:
            torch.bmm(dc[:, :, :r1], kf[:, :r1], out=gq[:, r0:r1])

    def u_all():
        for r0, r1 in chunks:
            if has_out_dtype:
                u[:, :r1] = torch.baddbmm(u[:, :r1], dc[:, :, :r1].transpose(1, 2), qs[:, r0:r1],
                                          out_dtype=torch.float32)
            else:
                u[:, :r1] += torch.bmm(dc[:, :, :r1].transpose(1, 2), qs[:, r0:r1])

    def dv_all():
        for r0, r1 in chunks:
            if has_out_dtype:
                dv[:, :r1] = torch.baddbmm(dv[:, :r1], p[:, :, :r1].transpose(1, 2), do[:, r0:r1],
                                           out_dtype=torch.float32)
            else:
                dv[:, :r1] += torch.bmm(p[:, :, :r1].transpose(1, 2), do[:, r0:r1])

    res = {}
    for name, fn in (("gq", gq_all), ("u", u_all), ("dv", dv_all)):
        try:
            res[name + "_ms"] = time_ms(fn, warmup=2, rep=5)
        except Exception as e:  # noqa: BLE001
            res[name + "_ms"] = f"{type(e).__name__}: {str(e)[:160]}"
    flops = sum(2 * BH * R * r1 * CQ * D for _, r1 in chunks)
    if isinstance(res["gq_ms"], float):
        res["gq_tflops"] = flops / res["gq_ms"] / 1e9
    rows[f"R={R}"] = res
    print(R, res, flush=True)
    del dc, p, gq, u, dv
print(json.dumps(rows), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)

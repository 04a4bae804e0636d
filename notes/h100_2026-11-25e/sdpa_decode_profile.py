"""Which kernels SDPA runs for a one-query decode step, and with what launch shape, beside mta.decode_attention.

bf16, Nq = 1, the four bench shapes where SDPA was faster in figures/bench_decode.json (B = 8). Prints, per
implementation, each kernel's name, grid, block, registers, shared memory and mean GPU time (torch.profiler's
trace), then the bench timer's median for SDPA and for mta.decode_attention at a few split counts.
"""
import json
import os
import tempfile

import torch
import torch.nn.functional as F

from mta import decode_attention
from mta.bench.timing import time_ms

SHAPES = [(8, 8, 8, 64, 32768), (8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 32, 8, 128, 32768)]


def kernels(fn, steps=5):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    seen = {}
    for e in json.load(open(path))["traceEvents"]:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        key = e["name"][:110]
        s = seen.setdefault(key, {"n": 0, "us": 0.0, "grid": a.get("grid"), "block": a.get("block"),
                                  "regs": a.get("registers per thread"), "smem": a.get("shared memory"),
                                  "occ": a.get("est. achieved occupancy %")})
        s["n"] += 1
        s["us"] += e["dur"]
    for k, s in seen.items():
        print(f"    {s['us'] / s['n']:8.1f} us  grid {s['grid']} block {s['block']} regs {s['regs']} "
              f"smem {s['smem']} occ {s['occ']}  {k}")


for B, Hq, Hkv, D, N in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gqa = Hq != Hkv
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    print(f"B={B} Hq={Hq} Hkv={Hkv} D={D} N={N}")
    print("  sdpa:")
    kernels(sdpa)
    print("  mta.decode_attention:")
    kernels(lambda: decode_attention(q, k, v))
    times = {"sdpa": time_ms(sdpa, warmup=10, rep=50)}
    for s in (None, 1, 2, 3, 4, 8):
        times[f"mta s={s}"] = time_ms(lambda: decode_attention(q, k, v, num_splits=s), warmup=10, rep=50)
    times["sdpa again"] = time_ms(sdpa, warmup=10, rep=50)
    print("  " + "  ".join(f"{n} {t * 1e3:.1f}" for n, t in times.items()))

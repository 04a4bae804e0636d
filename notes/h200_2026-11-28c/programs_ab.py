# python notes/h200_2026-11-28c/programs_ab.py OUTDIR   (GPU; from the repository root)
"""Phase 1 dealt in even shares (``mta.conv_two_phase.PROGRAMS``): forward + backward time (CUDA events, median
of REP calls after warm-up) at bf16, causal, B = 1, N = 8192, 6 x 11, for a few program counts; then the
kernels of one call at the default count (torch.profiler). Also the dK fold alone on a chunk's buffers, with and
without its near part and its previous chunk, at a few row tiles."""
import json
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import mta
from mta import conv_two_phase
from mta.conv_backward import conv_dk_fold_kernel
from mta.launch import cdiv, next_power_of_2

out = sys.argv[1]
N, REP = 8192, 20
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(dev).multi_processor_count
report = {"sms": sms, "ab": [], "profile": {}, "fold": []}


def timed(fn, rep=REP):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


for H, D in ((16, 128), (8, 64)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)

    def run():
        for t in (q, k, v, w):
            t.grad = None
        mta.conv_attention(q, k, v, w, causal=True).backward(do)
    for programs in (None, 2 * sms, sms // 2, 4 * sms):
        conv_two_phase.PROGRAMS = programs
        ms = timed(run)
        row = dict(H=H, D=D, programs=programs or sms, fwd_bwd_ms=ms)
        print(json.dumps(row), flush=True)
        report["ab"].append(row)
    conv_two_phase.PROGRAMS = None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name][0] += ev.device_time_total / 1000 / 5
            per[ev.name][1] += 1
    rows = sorted(((name[:100], ms, cnt // 5) for name, (ms, cnt) in per.items()), key=lambda r: -r[1])
    print(f"== d{D}: kernels {sum(r[1] for r in rows):.3f} ms per call", flush=True)
    for name, ms, cnt in rows:
        print(f"  {ms:8.3f} ms  x{cnt:<4d} {name}", flush=True)
    report["profile"][f"d{D}"] = rows
    del q, k, v, w, do
    torch.cuda.empty_cache()

# The dK fold alone: one chunk of 1024 keys, 16 heads, d = 128, 6 x 11, as the two phases launch it.
H, D, cq, ck, size = 16, 128, 6, 11, 1024
e_past = ck + cq - 3
ep_pad = max(16, next_power_of_2(e_past + 1))
u = torch.randn(H, size, cq * D, device=dev, dtype=torch.bfloat16)
prev = torch.randn(H, size, cq * D, device=dev, dtype=torch.bfloat16)
q = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)
g = torch.randn(1, H, N, ep_pad, device=dev)
wt = torch.randn(H, cq, ck, device=dev)
dk = torch.empty_like(k)
c0 = 4096
for near in (True, False):
    for has_prev in (True, False):
        for rows, warps in ((16, 2), (16, 4), (32, 4), (8, 1), (8, 2)):
            f0, f1 = c0 - 5, c0 + size - 5
            dwf = torch.empty((cdiv(f1 - f0, rows), 1, H, cq, ck), device=dev)

            def fold():
                conv_dk_fold_kernel[(cdiv(f1 - f0, rows), H)](
                    u, prev, g, q, k, wt, dk, dwf, u.stride(0), D, cq * D, prev.stride(0), *q.stride(), *k.stride(),
                    *dk.stride(), N, c0, c0 - size, f0, f1, H, 1, 0.1, NEAR=near, HAS_PREV=has_prev, CQ=cq, EP=e_past,
                    EP_PAD=ep_pad, CK=ck, CK_PAD=16, D=D, BLOCK_D=D, BLOCK_R=rows, num_warps=warps)
            ms = timed(fold, 50)
            row = dict(near=near, has_prev=has_prev, rows=rows, warps=warps, ms=ms)
            print(json.dumps(row), flush=True)
            report["fold"].append(row)
json.dump(report, open(f"{out}/programs_ab.json", "w"), indent=1)

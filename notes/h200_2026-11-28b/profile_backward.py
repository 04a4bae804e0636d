# python notes/h200_2026-11-28b/profile_backward.py OUTDIR   (GPU; from the repository root)
"""Where MTA forward + backward time goes, kernel by kernel (torch.profiler, CUDA time summed per kernel name
over REP calls, divided by REP). bf16, causal, B = 1, N = 8192, 6 x 11: d = 128 (H = 16) with the two phases,
d = 64 (H = 8) with one pass and with the two phases forced."""
import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import mta
from mta import conv_two_phase

out = sys.argv[1]
N, REP = 8192, 5
dev = torch.device("cuda")
report = {}
CASES = [("d128_two_phase", 16, 128, True), ("d64_two_phase", 8, 64, True)]
for label, H, D, force in CASES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)
    conv_two_phase.FORCE = None if force == "flash" else force

    def run():
        for t in (q, k, v, w):
            t.grad = None
        if force == "flash":
            mta.flash_attention(q, k, v, causal=True).backward(do)
        else:
            mta.conv_attention(q, k, v, w, causal=True).backward(do)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REP):
            run()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name][0] += ev.device_time_total / 1000 / REP if hasattr(ev, "device_time_total") else ev.cuda_time_total / 1000 / REP
            per[ev.name][1] += 1
    rows = sorted(((name[:110], ms, cnt // REP) for name, (ms, cnt) in per.items()), key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REP):
        run()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) / REP
    print(f"== {label}: kernels {total:.3f} ms per call, wall {wall:.3f} ms per call (no L2 flush)", flush=True)
    for name, ms, cnt in rows:
        print(f"  {ms:8.3f} ms  x{cnt:<4d} {name}")
    report[label] = dict(kernel_ms=total, wall_ms=wall, kernels=rows)
    del q, k, v, w, do
    torch.cuda.empty_cache()
conv_two_phase.FORCE = None

json.dump(report, open(f"{out}/profile_backward.json", "w"), indent=1)

# python notes/h200_2026-11-28b/dc_variants_time.py OUTDIR   (GPU; from the repository root)
"""Phase-1 kernel variants (dc_variants.py, made from the package's kernel and dc_variants.patch:
    git show 4b2815f:mta/conv_dc_kernels.py > notes/h200_2026-11-28b/dc_variants.py
    patch notes/h200_2026-11-28b/dc_variants.py notes/h200_2026-11-28b/dc_variants.patch
switches P16, STORE, DO_DV, DP_FIRST; STORE=False and DO_DV=False give wrong gradients: timing only): the kernel's time per forward + backward (torch.profiler, 3 calls), and the whole
forward + backward (mta.bench.timing). bf16, causal, 6 x 11, B = 1, N = 8192, two phases forced."""
import functools
import json
import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dc_variants  # noqa: E402

import mta  # noqa: E402
from mta import conv_two_phase  # noqa: E402
from mta.bench.timing import time_ms  # noqa: E402

out = sys.argv[1]
dev = torch.device("cuda")
conv_two_phase.FORCE = True
real_launch = conv_two_phase.launch
rows = []
for H, D in ((8, 64), (16, 128)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 8192, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, 8192, D, device=dev, dtype=torch.bfloat16)

    def run():
        for t in (q, k, v, w):
            t.grad = None
        mta.conv_attention(q, k, v, w, causal=True).backward(do)
    for flags in (dict(), dict(P16=True), dict(DP_FIRST=True), dict(STORE=False), dict(DO_DV=False)):
        def launch(kernel, grid, *args, **kw):
            if kernel is conv_two_phase.conv_dc_kernel:
                return real_launch(dc_variants.conv_dc_kernel, grid, *args, **kw, **flags)
            return real_launch(kernel, grid, *args, **kw)
        conv_two_phase.launch = launch
        run()
        ms = time_ms(run, warmup=2, rep=7)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                run()
            torch.cuda.synchronize()
        dc = sum(ev.device_time_total for ev in prof.events() if ev.name == "conv_dc_kernel") / 1000 / 3
        r = dict(D=D, H=H, flags=flags, fwd_bwd_ms=ms, dc_kernel_ms=dc)
        rows.append(r)
        print(json.dumps(r), flush=True)
    conv_two_phase.launch = real_launch
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(f"{out}/dc_variants_time.json", "w"), indent=1)

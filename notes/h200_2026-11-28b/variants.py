# python notes/h200_2026-11-28b/variants.py OUTDIR   (GPU; from the repository root)
"""The two-phase backward (forced) under variants of its phase-1 tile (with WIDTH, the depth of one streamed
product) and of its folds' row tiles: per variant, forward + backward time (mta.bench.timing, L2 flushed, median
of 7) and the kernels' times from torch.profiler (3 calls). bf16, causal, 6 x 11, B = 1, N = 8192; d = 64 (H = 8),
d = 128 (H = 16). Then one pass against two phases at shapes the rule has not seen measured."""
import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import mta
import mta.conv
from mta import conv_two_phase
from mta.bench.timing import time_ms

out = sys.argv[1]
dev = torch.device("cuda")
default_tile, default_post = conv_two_phase.phase_one_tile, mta.conv.post_pass_tile
rows = []


def setup(H, D, N, cq=6, ck=11):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, cq, ck, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)

    def run():
        for t in (q, k, v, w):
            t.grad = None
        mta.conv_attention(q, k, v, w, causal=True).backward(do)
    return run, (q, k, v, w)


def kernel_times(run):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name.split("<")[0][:40]] += ev.device_time_total / 1000 / 3
    return {k: round(v, 4) for k, v in sorted(per.items(), key=lambda x: -x[1]) if v > 0.02}


def variant(tile=None, dk_fold=None, dq_fold=None):
    def phase_one_tile(block_d, dtype, causal):
        t = default_tile(block_d, dtype, causal)
        return t if tile is None else dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "WIDTH"), tile))

    def post_pass_tile(width, max_rows, warps=2):
        if max_rows == 64 and warps == 2 and dk_fold is not None:
            return dk_fold
        if max_rows == 64 and warps == 4 and dq_fold is not None:
            return dq_fold
        return default_post(width, max_rows, warps)
    conv_two_phase.phase_one_tile, mta.conv.post_pass_tile = phase_one_tile, post_pass_tile


conv_two_phase.FORCE = True
VARIANTS = {64: [dict(), dict(tile=(128, 128, 8, 3, 64)), dict(tile=(128, 128, 8, 2, 64)),
                 dict(dk_fold=(64, 4)), dict(dk_fold=(32, 4)), dict(dk_fold=(64, 8)), dict(dq_fold=(32, 4)),
                 dict(dq_fold=(128, 8))],
            128: [dict(), dict(tile=(128, 128, 8, 2, 64)), dict(tile=(128, 128, 8, 2, 128)),
                  dict(dk_fold=(32, 4)), dict(dk_fold=(64, 8)), dict(dk_fold=(16, 4)), dict(dq_fold=(16, 4)),
                  dict(dq_fold=(64, 8))]}
for H, D in ((8, 64), (16, 128)):
    run, leaves = setup(H, D, 8192)
    ref = None
    for v in VARIANTS[D]:
        variant(**v)
        r = dict(D=D, H=H, **{k: list(x) for k, x in v.items()})
        try:
            run()
            g = [t.grad.float() for t in leaves]
            ref = g if ref is None else ref
            r["grad_rel_diff_vs_first"] = [((a - b).norm() / b.norm()).item() for a, b in zip(g, ref)]
            r["ms"] = time_ms(run, warmup=2, rep=7)
            r["kernels"] = kernel_times(run)
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(r)
        print(json.dumps(r), flush=True)
    variant()
    del run, leaves
    torch.cuda.empty_cache()

# One pass against two phases where the rule's reach is not measured yet.
for H, D, N, cq, ck in ((8, 64, 8192, 1, 1), (8, 64, 8192, 2, 9), (16, 128, 8192, 3, 3), (8, 64, 1024, 6, 11),
                        (16, 128, 1024, 6, 11), (8, 64, 2048, 6, 11), (8, 96, 4096, 6, 11)):
    run, leaves = setup(H, D, N, cq, ck)
    r = dict(H=H, D=D, N=N, cq=cq, ck=ck)
    for name, force in (("one_pass", False), ("two_phase", True)):
        conv_two_phase.FORCE = force
        try:
            run()
            r[name + "_ms"] = time_ms(run, warmup=2, rep=7)
        except Exception as e:  # noqa: BLE001
            r[name + "_ms"] = f"{type(e).__name__}: {str(e)[:200]}"
    rows.append(r)
    print(json.dumps(r), flush=True)
    del run, leaves
conv_two_phase.FORCE = None
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(f"{out}/variants.json", "w"), indent=1)

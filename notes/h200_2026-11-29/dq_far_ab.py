# python notes/h200_2026-11-29/dq_far_ab.py OUTDIR TILES_JSON   (GPU; from the repository root)
"""dq's far part by one Triton product per row tile (``mta.conv_two_phase.DQ_FAR_KERNEL``, tiles of
``dq_far_tile``) against the Gq GEMMs + fold: forward + backward time as the benchmark times it, bf16, causal,
B = 1, N = 8192, 6 x 11, variants interleaved over rounds; then a profile of the kernels of the first variant."""
import json
import statistics
import sys

import torch

import mta
from mta import conv_two_phase
from mta.bench.timing import time_samples_ms

out = sys.argv[1]
N = 8192
dev = torch.device("cuda")
TABLE = conv_two_phase.dq_far_tile
# (DQ_FAR_KERNEL, dq tile (BLOCK_M, BLOCK_K, warps, stages) or None: the table's)
VARIANTS = [(True, None), (False, None)] + [(True, t) for t in map(tuple, json.loads(sys.argv[2]))]


def use(variant):
    conv_two_phase.DQ_FAR_KERNEL = variant[0]
    tile = variant[1]
    conv_two_phase.dq_far_tile = (TABLE if tile is None else
                                  lambda *a: dict(zip(("BLOCK_M", "BLOCK_K", "num_warps", "num_stages"), tile)))


report = []
for H, D in ((16, 128), (8, 64)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)

    def clear():
        for t in (q, k, v, w):
            t.grad = None

    def run():
        mta.conv_attention(q, k, v, w, causal=True).backward(do)
    grads = {}
    for variant in VARIANTS:  # compile each, and keep its gradients to compare
        use(variant)
        clear()
        run()
        grads[variant] = [t.grad.float().clone() for t in (q, k, v, w)]
    base = grads[VARIANTS[1]]  # the GEMM path
    samples = {vr: [] for vr in VARIANTS}
    for rnd in range(4):
        for variant in VARIANTS:
            use(variant)
            torch.cuda.reset_peak_memory_stats()
            samples[variant] += time_samples_ms(run, warmup=2, rep=8, before_each=clear)
    for variant, ts in samples.items():
        diff = [((a - b).norm() / b.norm()).item() for a, b in zip(grads[variant], base)]
        row = dict(H=H, D=D, dq_far_kernel=variant[0], dq_tile=variant[1], median_ms=statistics.median(ts),
                   min_ms=min(ts), n=len(ts), rel_diff_from_gemm_path_dq_dk_dv_dw=diff)
        print(json.dumps(row), flush=True)
        report.append(row)
    use(VARIANTS[0])
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            clear()
            run()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name[:100]
            t, c = per.get(name, (0.0, 0))
            per[name] = (t + e.device_time_total / 1e3 / 3, c + 1)
    print(f"== d{D}: kernels {sum(t for t, _ in per.values()):.3f} ms per call", flush=True)
    for name, (t, c) in sorted(per.items(), key=lambda x: -x[1][0]):
        print(f"  {t:7.3f} ms  x{c // 3:<3d} {name}", flush=True)
    del q, k, v, w, do
    torch.cuda.empty_cache()
use(VARIANTS[0])
json.dump(report, open(f"{out}/dq_far_ab_{sys.argv[3] if len(sys.argv) > 3 else 'run'}.json", "w"), indent=1)

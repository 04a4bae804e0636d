# python notes/h200_2026-11-29/chunks_ab.py OUTDIR   (GPU; from the repository root)
"""Causal chunks of keys wider late (``mta.conv_two_phase.key_chunks``) against equal chunks, and the dq kernel
(``DQ_FAR_KERNEL``) on and off: forward + backward time as the benchmark times it, bf16, causal, B = 1,
N = 8192, 6 x 11, variants interleaved over rounds; then a profile of the default's kernels."""
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
WIDER = conv_two_phase.key_chunks


def equal(n, size, causal):
    return [(c0, min(c0 + size, n)) for c0 in range(0, n, size)]


VARIANTS = {"default": (WIDER, None), "equal chunks": (equal, None), "dq kernel on": (WIDER, True),
            "dq kernel off": (WIDER, False), "equal chunks, dq kernel on": (equal, True)}
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

    def use(name):
        conv_two_phase.key_chunks, conv_two_phase.DQ_FAR_KERNEL = VARIANTS[name]
    grads, peaks = {}, {}
    for name in VARIANTS:
        use(name)
        clear()
        run()
        torch.cuda.synchronize()
        clear()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        grads[name] = [t.grad.float().clone() for t in (q, k, v, w)]
    samples = {name: [] for name in VARIANTS}
    for rnd in range(4):
        for name in VARIANTS:
            use(name)
            samples[name] += time_samples_ms(run, warmup=2, rep=8, before_each=clear)
    for name, ts in samples.items():
        diff = [((a - b).norm() / b.norm()).item() for a, b in zip(grads[name], grads["default"])]
        row = dict(H=H, D=D, variant=name, median_ms=statistics.median(ts), min_ms=min(ts), n=len(ts),
                   peak_bytes_over_inputs=peaks[name], rel_diff_from_default_dq_dk_dv_dw=diff)
        print(json.dumps(row), flush=True)
        report.append(row)
    use("default")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            clear()
            run()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            t, c = per.get(e.name[:90], (0.0, 0))
            per[e.name[:90]] = (t + e.device_time_total / 1e3 / 3, c + 1)
    print(f"== d{D}: kernels {sum(t for t, _ in per.values()):.3f} ms per call", flush=True)
    for name, (t, c) in sorted(per.items(), key=lambda x: -x[1][0])[:12]:
        print(f"  {t:7.3f} ms  x{c // 3:<3d} {name}", flush=True)
    del q, k, v, w, do
    torch.cuda.empty_cache()
use("default")
json.dump(report, open(f"{out}/chunks_ab.json", "w"), indent=1)

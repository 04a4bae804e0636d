# python notes/h200_2026-11-29b/settings_ab.py OUTDIR NAME VARIANTS_JSON   (GPU; from the repository root)
"""Forward + backward time of ``mta.conv_attention`` as the benchmark times it (bf16, causal, B = 1, N = 8192,
6 x 11; d = 128 at 16 heads, d = 64 at 8) under variants of module settings, interleaved over 4 rounds; each
variant's gradients compared with the first's; then a profile of each variant's kernels (the first's in full, the
others' that differ from it by more than 2 us). VARIANTS_JSON: {"label": {"SETTING": value, ...}, ...}: "NAME" is
a setting of ``mta.conv_two_phase``, "conv.NAME" of ``mta.conv``; list values become tuples, except for
"dq_far_tile": [BLOCK_M, BLOCK_K, warps, stages] (the dq kernel's tile)."""
import json
import statistics
import sys

import torch

import mta
from mta import conv, conv_two_phase
from mta.bench.timing import time_samples_ms

out, label, variants = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
N = 8192
dev = torch.device("cuda")


def target(key):
    return (conv, key[5:]) if key.startswith("conv.") else (conv_two_phase, key)


DEFAULTS = {key: getattr(*target(key)) for v in variants.values() for key in v}


def use(name):
    for key, value in {**DEFAULTS, **variants[name]}.items():
        if key == "dq_far_tile" and isinstance(value, list):  # [BLOCK_M, BLOCK_K, warps, stages]
            value = (lambda t: lambda *a: dict(zip(("BLOCK_M", "BLOCK_K", "num_warps", "num_stages"), t)))(value)
        setattr(*target(key), tuple(value) if isinstance(value, list) else value)


def kernel_times(run, clear):
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
    return per


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
    grads, peaks = {}, {}
    for name in variants:
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
    first = next(iter(variants))
    samples = {name: [] for name in variants}
    for rnd in range(4):
        for name in variants:
            use(name)
            samples[name] += time_samples_ms(run, warmup=2, rep=8, before_each=clear)
    for name, ts in samples.items():
        diff = [((a - b).norm() / b.norm()).item() for a, b in zip(grads[name], grads[first])]
        row = dict(H=H, D=D, variant=name, settings=variants[name], median_ms=statistics.median(ts),
                   min_ms=min(ts), n=len(ts), peak_bytes_over_inputs=peaks[name],
                   rel_diff_from_first_dq_dk_dv_dw=diff)
        print(json.dumps(row), flush=True)
        report.append(row)
    per_first = None
    for name in variants:
        use(name)
        per = kernel_times(run, clear)
        if per_first is None:
            per_first = per
            print(f"== d{D} {name}: kernels {sum(t for t, _ in per.values()):.3f} ms per call", flush=True)
            for kname, (t, c) in sorted(per.items(), key=lambda x: -x[1][0])[:16]:
                print(f"  {t:7.3f} ms  x{c // 3:<3d} {kname}", flush=True)
            continue
        print(f"== d{D} {name}: kernels {sum(t for t, _ in per.values()):.3f} ms per call; differing from {first}:")
        for kname in sorted(set(per) | set(per_first)):
            t, t0 = per.get(kname, (0.0, 0))[0], per_first.get(kname, (0.0, 0))[0]
            if abs(t - t0) > 0.002:
                print(f"  {t:7.3f} ms (was {t0:7.3f})  {kname}", flush=True)
    del q, k, v, w, do
    torch.cuda.empty_cache()
use(next(iter(variants)))
json.dump(report, open(f"{out}/{label}.json", "w"), indent=1)

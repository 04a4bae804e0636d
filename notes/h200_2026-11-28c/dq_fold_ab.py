# python notes/h200_2026-11-28c/dq_fold_ab.py OUTDIR   (GPU; from the repository root)
"""The dQ fold's row tile (``mta.conv_two_phase.DQ_FOLD_TILE``): forward + backward time as the benchmark times
it, bf16, causal, B = 1, N = 8192, 6 x 11, variants interleaved over rounds (as ``beside_ab.py``)."""
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
VARIANTS = [None, (8, 1), (8, 2), (16, 4), (32, 4)]
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
    samples = {vr: [] for vr in VARIANTS}
    for rnd in range(4):
        for tile in VARIANTS:
            conv_two_phase.DQ_FOLD_TILE = tile
            samples[tile] += time_samples_ms(run, warmup=2, rep=8, before_each=clear)
    for tile, ts in samples.items():
        row = dict(H=H, D=D, dq_fold_tile=tile, median_ms=statistics.median(ts), min_ms=min(ts), n=len(ts))
        print(json.dumps(row), flush=True)
        report.append(row)
    del q, k, v, w, do
    torch.cuda.empty_cache()
conv_two_phase.DQ_FOLD_TILE = None
json.dump(report, open(f"{out}/dq_fold_ab.json", "w"), indent=1)

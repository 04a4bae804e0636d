"""H100: forward + backward of mta.conv_attention with the fused backward against the row-chunk backward
(mta.conv_chunked, forced), bf16, causal, B = 1, at the benchmark's shapes.

    PYTHONPATH=. python notes/h100_remeasure_2026-11-24/chunked_vs_fused.py
"""
import torch

import mta
import mta.conv
from mta.bench.timing import time_ms

fits = mta.conv.runs_chunked
torch.manual_seed(0)
for H, D, cq, ck, N in [(8, 64, 6, 11, 8192), (16, 128, 6, 11, 8192), (16, 128, 11, 11, 8192), (8, 64, 11, 11, 8192),
                        (4, 256, 6, 11, 8192)]:
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
    do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)

    def step():
        o = mta.conv_attention(q, k, v, w)
        return torch.autograd.grad(o, (q, k, v, w), do)
    line = []
    for name, rule in (("fused", fits), ("chunks", lambda *a: True)):
        mta.conv.runs_chunked = rule
        step()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - base
        line.append(f"{name} {time_ms(step, rep=5, warmup=2):.2f} ms ({peak / 2 ** 20:.0f} MiB)")
    mta.conv.runs_chunked = fits
    print(f"H={H} d={D} {cq}x{ck} N={N}: " + ", ".join(line), flush=True)

"""Host time of one decode step (a loop of calls, synchronized at the end: launch-bound when the GPU work is small),
against SDPA and flash_attention, and where the host time goes (cProfile of the mta call).

    PYTHONPATH=. python notes/h100_2026-11-24b/host_overhead.py
"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import mta


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


q = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
qc = torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.bfloat16)
w = 0.2 * torch.randn(8, 6, 11, device="cuda")
lens = torch.tensor([4096], dtype=torch.int32)
cases = {
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    "decode_attention": lambda: mta.decode_attention(q, k, v),
    "decode_attention, cpu lengths": lambda: mta.decode_attention(q, k, v, cache_seqlens=lens),
    "decode_attention, 1 split": lambda: mta.decode_attention(q, k, v, num_splits=1),
    "conv_decode_attention": lambda: mta.conv_decode_attention(qc, k, v, w),
    "flash_attention": lambda: mta.flash_attention(q, k, v, causal=True),
    "torch add": lambda: q + q,
}
for name, fn in cases.items():
    print(f"{name}: {per_call_us(fn):.1f} us per call", flush=True)
profile = cProfile.Profile()
profile.enable()
for _ in range(500):
    mta.decode_attention(q, k, v)
torch.cuda.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(25)

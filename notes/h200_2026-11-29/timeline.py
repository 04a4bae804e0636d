# python notes/h200_2026-11-29/timeline.py OUTDIR   (GPU; from the repository root)
"""Where forward + backward's wall time goes (bf16, causal, 6 x 11, N = 8192; d = 128 at 16 heads, d = 64 at 8):
the host's time to queue one call, and from a profiler trace, each stream's busy time and the idle gaps between
kernels on the main stream, with the kernels on either side of the largest gaps."""
import json
import sys
import time

import torch

import mta

out = sys.argv[1]
N = 8192
dev = torch.device("cuda")
for H, D in ((16, 128), (8, 64)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)

    def run():
        for t in (q, k, v, w):
            t.grad = None
        mta.conv_attention(q, k, v, w, causal=True).backward(do)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    hosts = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        hosts.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    path = f"{out}/trace_d{D}.json"
    prof.export_chrome_trace(path)
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    streams = {}
    for e in events:
        streams.setdefault(e["args"].get("stream"), []).append(e)
    print(f"== d{D}: host time to queue a call {sorted(hosts)[2]:.3f} ms (median of 5)")
    t_first = min(e["ts"] for e in events)
    t_last = max(e["ts"] + e["dur"] for e in events)
    print(f"   first kernel to last end: {(t_last - t_first) / 1e3:.3f} ms")
    for s, evs in streams.items():
        evs.sort(key=lambda e: e["ts"])
        busy = sum(e["dur"] for e in evs) / 1e3
        gaps = [(evs[i + 1]["ts"] - (evs[i]["ts"] + evs[i]["dur"]), evs[i]["name"][:40], evs[i + 1]["name"][:40])
                for i in range(len(evs) - 1)]
        idle = sum(g for g, _, _ in gaps if g > 0) / 1e3
        print(f"   stream {s}: {len(evs)} kernels, busy {busy:.3f} ms, idle between them {idle:.3f} ms")
        for g, a, b in sorted(gaps, reverse=True)[:8]:
            print(f"      gap {g / 1e3:.3f} ms after {a} before {b}")
    del q, k, v, w, do
    torch.cuda.empty_cache()

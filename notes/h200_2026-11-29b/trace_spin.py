# python notes/h200_2026-11-29b/trace_spin.py OUTDIR [SETTINGS_JSON [D ...]]   (GPU; from the repository root)
"""Where forward + backward's GPU time goes when the host is ahead (as the benchmark times it): bf16, causal,
6 x 11, N = 8192, d = 128 at 16 heads (d = 64 at 8). The GPU spins 40 ms while one call is queued, then a profiler
trace gives every kernel's start and duration per stream, from the spin's end, and the main stream's idle gaps.
SETTINGS_JSON: ``mta.conv_two_phase`` module settings to trace under, e.g. '{"SIDE_PRIORITY": -1}'."""
import json
import sys

import torch

import mta
from mta import conv_two_phase
from mta.bench.timing import L2_FLUSH_BYTES

out = sys.argv[1]
settings = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
for name, value in settings.items():
    setattr(conv_two_phase, name, value)
tag = "_".join(f"{k}{v}" for k, v in settings.items())
dims = [int(x) for x in sys.argv[3:]] or [128]
N = 8192
dev = torch.device("cuda")
flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=dev)
for D in dims:
    H = 16 if D == 128 else 8
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
    from torch.profiler import ProfilerActivity, profile
    spans = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            flush.fill_(1)
            torch.cuda._sleep(60_000_000)
            run()
            torch.cuda.synchronize()
    path = f"{out}/trace_spin_d{D}{tag}.json"
    prof.export_chrome_trace(path)
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    events.sort(key=lambda e: e["ts"])
    sleeps = [i for i, e in enumerate(events) if "sleep" in e["name"].lower() or "spin" in e["name"].lower()]
    i0 = sleeps[-1]
    t0 = events[i0]["ts"] + events[i0]["dur"]
    call = events[i0 + 1:]
    main = events[i0]["args"].get("stream")
    t_end = max(e["ts"] + e["dur"] for e in call)
    print(f"== d{D} H{H} {settings}: spin end to last kernel end {(t_end - t0) / 1e3:.3f} ms; main stream {main}")
    busy = {}
    for e in call:
        s = e["args"].get("stream")
        busy[s] = busy.get(s, 0) + e["dur"]
        print(f"  s{s:<3} {(e['ts'] - t0) / 1e3:8.3f} +{e['dur'] / 1e3:7.3f}  {e['name'][:70]}")
    print("  busy per stream (ms):", {s: round(b / 1e3, 3) for s, b in busy.items()})
    m = [e for e in call if e["args"].get("stream") == main]
    gaps = [((m[i + 1]["ts"] - m[i]["ts"] - m[i]["dur"]) / 1e3, m[i]["name"][:40], m[i + 1]["name"][:40])
            for i in range(len(m) - 1)]
    print(f"  main stream idle after its first kernel: {sum(g for g, _, _ in gaps if g > 0):.3f} ms "
          f"(first kernel at {(m[0]['ts'] - t0) / 1e3:.3f})")
    for g, a, b in sorted(gaps, reverse=True)[:10]:
        print(f"    gap {g:.3f} ms after {a} before {b}")
    del q, k, v, w, do
    torch.cuda.empty_cache()

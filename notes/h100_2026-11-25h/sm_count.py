"""Is B = 8 decode bound by DRAM or by the SMs that stream? The shipped split kernel, one split, 32k keys a program,
Hq = Hkv = 4, d = 64, bf16, Nq = 1, with 124, 128, 132, 136 and 264 (batch, head) pairs: 128 programs leave 4 of
the H100's 132 SMs idle. If time grows with the bytes from 128 to 132 programs, DRAM is the limit; if it stays, the
idle SMs are (and a grid that fills all 132 would gain about 3%). Event timing; cuDNN and a plain read beside."""
import json
import sys
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import mta
from mta.bench.timing import time_ms

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
out = []
N, H = 32768, 4
for B in (31, 32, 33, 34, 66):
    q = torch.randn(B, H, 1, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, H, N, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, H, N, 64, device=dev, dtype=torch.bfloat16)
    flat = torch.cat([k.reshape(-1), v.reshape(-1)])
    nb = 2 * k.numel() * 2
    fns = (("decode_1split", lambda: mta.decode_attention(q, k, v, num_splits=1)),
           ("decode", lambda: mta.decode_attention(q, k, v)),
           ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v)),
           ("read", lambda: flat.sum()))
    for name, fn in fns:
        ev = [time_ms(fn, warmup=5, rep=40) * 1e3 for _ in range(2)]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        kern = {e.key[:40]: round(e.device_time, 1) for e in prof.key_averages() if e.device_time > 0}
        out.append(dict(B=B, H=H, N=N, pairs=B * H, impl=name, event_us=ev, kernels_us=kern))
        print(f"pairs {B*H:4d} {name:14s}: event {ev[0]:.1f} {ev[1]:.1f} us ({nb / min(ev) / 1e6:.3f} TB/s, "
              f"{nb / min(ev) / 1e6 / (B*H):.4f} TB/s a program); kernels {kern}", flush=True)
    del q, k, v, flat
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=out), open(sys.argv[1], "w"), indent=1)

"""Same bytes, same stream per program (32k keys), 128 programs: 16 x 8 heads at 32k keys (one split), 8 x 8 at 64k
(two), 4 x 8 at 128k (four). Is the loss of a split its merge and partial states, or the length of each program's
stream? Event timing (L2 flushed) and torch.profiler kernel times (back to back); cuDNN beside. bf16, d = 64, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import mta
from mta.bench.timing import time_ms

dev = torch.device("cuda")
out = []
for B, N in ((16, 32768), (8, 65536), (4, 131072), (16, 65536)):
    q = torch.randn(B, 8, 1, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, 8, N, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, 8, N, 64, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    for name, fn in (("decode", lambda: mta.decode_attention(q, k, v)), ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v))):
        ev = [time_ms(fn, warmup=5, rep=40) * 1e3 for _ in range(2)]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        kern = {e.key[:48]: round(e.device_time, 1) for e in prof.key_averages() if e.device_time > 0}
        out.append(dict(B=B, N=N, impl=name, event_us=ev, kernels_us=kern))
        print(f"{B}x8 N{N} {name}: event {ev[0]:.1f} {ev[1]:.1f} us ({nb / ev[0] / 1e6:.3f} TB/s); kernels {kern}",
              flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=out), open(sys.argv[1], "w"), indent=1)

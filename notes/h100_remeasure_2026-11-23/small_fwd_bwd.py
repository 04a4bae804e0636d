"""Why is conv fwd+bwd at N=1024 slower than committed? GPU time vs host time, compile-ahead on/off."""
import os, sys, time, statistics
import torch, mta
from mta.bench.timing import time_samples_ms
dev = torch.device("cuda")
for N, D in ((1024, 64), (2048, 64), (1024, 128)):
    q, k, v = (torch.randn(1, 8 if D == 64 else 16, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    w = 0.2 * torch.randn(q.shape[1], 6, 11, device=dev)
    dout = torch.randn_like(q)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, w)]
    def clear():
        for t in leaves: t.grad = None
    fb = lambda: mta.conv_attention(*leaves, causal=True).backward(dout)
    for _ in range(3): clear(); fb()
    torch.cuda.synchronize()
    s = time_samples_ms(fb, before_each=clear, rep=30)
    # host time to issue one fwd+bwd (no sync inside)
    host = []
    for _ in range(20):
        clear(); torch.cuda.synchronize(); t = time.perf_counter(); fb(); host.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    # GPU time without the spin trick: sync, time 20 back-to-back calls
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): clear(); fb()
    torch.cuda.synchronize(); loop = (time.perf_counter() - t) / 20
    print(f"N={N} D={D} ahead={os.environ.get('MTA_COMPILE_AHEAD', '1')}: bench-style median {statistics.median(s):.3f} ms "
          f"(min {min(s):.3f}, max {max(s):.3f}); host issue {statistics.median(host) * 1e3:.3f} ms; loop {loop * 1e3:.3f} ms",
          flush=True)

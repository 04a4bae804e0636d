"""H100: the MTA backward in row chunks (mta.conv_chunked), which conv_attention takes where the fused backward does
not fit: exactness against the float64 reference, bitwise repeat, and the time of a forward + backward beside the
fused one's at a shape that fits (cq = 12) and the chunks' at one that does not (cq = 16), bf16, d = 256, causal.

    PYTHONPATH=. python notes/h100_remeasure_2026-11-24/chunked_backward.py
"""
import torch

import mta
import mta.conv
from mta.bench.timing import time_ms


def grads(fn, xs, do, **kw):
    xs = [x.detach().clone().requires_grad_() for x in xs]
    fn(*xs, **kw).backward(do)
    return [x.grad for x in xs]


torch.manual_seed(0)
dev = "cuda"
for dtype, D, cq, ck, N, causal in [(torch.float32, 96, 16, 15, 200, True), (torch.bfloat16, 256, 16, 15, 300, True),
                                    (torch.float16, 128, 32, 33, 77, False), (torch.float32, 256, 7, 3, 64, True)]:
    q = torch.randn(2, 4, N, D, device=dev, dtype=dtype)
    k, v = (torch.randn(2, 2, N, D, device=dev, dtype=dtype) for _ in range(2))
    w = 0.2 * torch.randn(4, cq, ck, device=dev)
    do = torch.randn(2, 4, N, D, device=dev, dtype=dtype)
    assert mta.conv.runs_chunked(cq, D, dtype)
    out = grads(mta.conv_attention, (q, k, v, w), do, causal=causal)
    again = grads(mta.conv_attention, (q, k, v, w), do, causal=causal)
    ref = grads(mta.conv_attention_reference, [x.double() for x in (q, k, v, w)], do.double(), causal=causal)
    errs = [((a.double() - r).norm() / r.norm()).item() for a, r in zip(out, ref)]
    same = all(torch.equal(a, b) for a, b in zip(out, again))
    print(f"{dtype} d={D} {cq}x{ck} N={N} causal={causal}: rel err dq dk dv dw " + " ".join(f"{e:.1e}" for e in errs)
          + f"; bitwise repeat {same}", flush=True)

for cq, ck in ((12, 15), (16, 15)):
    for N in (2048, 8192):
        q, k, v = (torch.randn(1, 4, N, 256, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        w = (0.2 * torch.randn(4, cq, ck, device=dev)).requires_grad_()
        do = torch.randn(1, 4, N, 256, device=dev, dtype=torch.bfloat16)

        def step():
            o = mta.conv_attention(q, k, v, w)
            return torch.autograd.grad(o, (q, k, v, w), do)
        step()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - base
        ms = time_ms(step, rep=5, warmup=2)
        print(f"bf16 d=256 H=4 {cq}x{ck} N={N} ({'chunks' if mta.conv.runs_chunked(cq, 256, torch.bfloat16) else 'fused'}):"
              f" forward + backward {ms:.2f} ms, peak extra {peak / 2 ** 20:.0f} MiB", flush=True)

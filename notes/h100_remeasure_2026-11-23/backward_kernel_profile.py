# python notes/h100_remeasure_2026-11-23/backward_kernel_profile.py  (GPU; from the repository root)
"""GPU time per kernel of one MTA forward + backward (bf16, causal, 6 x 11, N = 8192), torch.profiler, mean of 5
calls after 3 warm-ups; also flash attention's forward + backward on the same shape."""
import torch
from torch.profiler import ProfilerActivity, profile

import mta

for H, D in ((8, 64), (16, 128)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 8192, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    w = (torch.randn(H, 6, 11, device="cuda") * 0.2).requires_grad_()
    do = torch.randn_like(q)
    for name, f in (("mta", lambda: mta.conv_attention(q, k, v, w, causal=True)),
                    ("flash", lambda: mta.flash_attention(q, k, v, causal=True))):
        for _ in range(3):
            f().backward(do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                f().backward(do)
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / 5 / 1e3, e.count // 5) for e in prof.key_averages()
                if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"\n{name} d={D} H={H}: {total:.3f} ms of GPU time per forward + backward")
        for key, ms, n in rows[:16]:
            print(f"  {ms:7.3f} ms  x{n}  {key[:90]}")

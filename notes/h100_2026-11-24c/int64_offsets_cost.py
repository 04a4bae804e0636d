"""H100: forward + backward time of mta.conv_attention (bf16, causal, 6 x 11) and mta.flash_attention at
N = 8192, B = 1 (H = 8, d = 64; H = 16, d = 128), for the package found first on PYTHONPATH: run once with the
code before the batch/head offsets went int64 and once after, alternating, to see what the int64 costs.

    PYTHONPATH=zz_old:. python notes/h100_2026-11-24c/int64_offsets_cost.py old
"""
import sys

import torch

import mta
from mta.bench.timing import time_ms

tag = sys.argv[1]
torch.manual_seed(0)
for H, D in ((8, 64), (16, 128)):
    q, k, v = (torch.randn(1, H, 8192, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (0.2 * torch.randn(H, 6, 11, device="cuda")).requires_grad_()
    do = torch.randn_like(q)
    for name, fn in (("conv", lambda: mta.conv_attention(q, k, v, w, causal=True)),
                     ("flash", lambda: mta.flash_attention(q, k, v, causal=True))):
        def step():
            return torch.autograd.grad(fn(), (q, k, v), do)
        step()
        print(f"{tag} {name} d={D}: fwd {time_ms(fn):.3f} ms, fwd+bwd {time_ms(step):.3f} ms  ({mta.__file__})",
              flush=True)

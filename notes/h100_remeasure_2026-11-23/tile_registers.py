"""H100: MTA forward + backward (bf16, causal, B = 1, N = 8192) with the backward tiles the launcher fits from the
table, with and without the register bound on the accumulator plus one streamed tile
(``mta.conv_backward.TILE_REGISTERS``), alternating, for each ``cq x ck, H, d`` in CASES. Prints the launched tiles,
the time and the gradients' relative difference to the first run.

    PYTHONPATH=. CASES='[(11, 11, 16, 128), (6, 11, 4, 256)]' python notes/h100_remeasure_2026-11-23/tile_registers.py
"""
import os

import torch

import mta
import mta.conv
from mta import conv_backward
from mta.bench.timing import time_ms

N = 8192
bound = conv_backward.TILE_REGISTERS
launched = []
fit = mta.conv._fit_backward_tile
mta.conv._fit_backward_tile = lambda config, owned, *a: launched.append((owned, fit(config, owned, *a))) or launched[-1][1]
for cq, ck, H, D in eval(os.environ.get("CASES", "[(11, 11, 16, 128)]")):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
    do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)

    def step():
        o = mta.conv_attention(q, k, v, w, causal=True)
        return torch.autograd.grad(o, (q, k, v, w), do)
    ref = None
    for registers in (bound, 10 ** 9, bound, 10 ** 9):
        conv_backward.TILE_REGISTERS = registers
        launched.clear()
        grads = step()
        tiles = sorted({(owned, tuple(c.values())) for owned, c in launched})
        ms = time_ms(step, rep=20)
        ref = grads if ref is None else ref
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
        print(f"{cq}x{ck} H={H} d={D} TILE_REGISTERS={registers}: {tiles}: fwd+bwd {ms:.3f} ms; rel diff "
              + " ".join(f"{e:.1e}" for e in errs), flush=True)
    conv_backward.TILE_REGISTERS = bound

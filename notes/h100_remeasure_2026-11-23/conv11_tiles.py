"""H100: MTA forward + backward at 11 x 11 (bf16, causal, N = 8192, B = 1; H = 8, d = 64 unless H, D, CQ, CK say otherwise) with the backward's
table tiles (conv_dq, conv_dkdv, every width) replaced by each pair in PAIRS; the launcher still shrinks a tile
that does not fit (mta.conv._fit_backward_tile), and the tile it launches is printed. The table's pair first
and last (the spread is the noise).

    PYTHONPATH=. PAIRS='[((64, 32, 8, 2), (32, 64, 8, 1))]' python notes/h100_remeasure_2026-11-23/conv11_tiles.py
"""
import json
import os

import torch

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

CQ, CK = int(os.environ.get("CQ", 11)), int(os.environ.get("CK", 11))
pairs = [None] + eval(os.environ.get("PAIRS", "[]")) + [None]
table = {name: dict(tuning.HOPPER[name]) for name in ("conv_dq", "conv_dkdv")}
launched = []
fit = mta.conv._fit_backward_tile
mta.conv._fit_backward_tile = lambda config, owned, *a: launched.append((owned, fit(config, owned, *a))) or launched[-1][1]
out = {"gpu": torch.cuda.get_device_name(), "kernel": [CQ, CK], "H": int(os.environ.get("H", 8)), "D": int(os.environ.get("D", 64)), "rows": []}
torch.manual_seed(0)
H, N, D = int(os.environ.get("H", 8)), 8192, int(os.environ.get("D", 64))
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
w = (0.2 * torch.randn(H, CQ, CK, device="cuda")).requires_grad_()
do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
ref = None
for pair in pairs:
    for name, tile in zip(("conv_dq", "conv_dkdv"), pair or (None, None)):
        tuning.HOPPER[name] = {key: tile for key in table[name]} if tile else dict(table[name])

    def step():
        o = mta.conv_attention(q, k, v, w, causal=True)
        return torch.autograd.grad(o, (q, k, v, w), do)
    launched.clear()
    try:
        grads = step()
        tiles = [(owned, tuple(c.values())) for owned, c in launched]
        ms = time_ms(step, rep=20)
    except Exception as error:  # noqa: BLE001 - a tile that does not compile or launch is a result
        print(f"{pair}: {type(error).__name__}: {str(error)[:200]}", flush=True)
        out["rows"].append({"pair": pair, "error": repr(error)[:300]})
        continue
    ref = grads if ref is None else ref
    errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
    print(f"{pair or 'table'} -> {tiles}: fwd+bwd {ms:.3f} ms; rel diff " + " ".join(f"{e:.1e}" for e in errs),
          flush=True)
    out["rows"].append({"pair": pair, "launched": tiles, "ms": ms, "rel_diff": errs})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"conv{CQ}x{CK}_d{D}_tiles.json"), "w"), indent=1)

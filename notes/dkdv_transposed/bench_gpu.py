"""H100: MTA forward + backward (bf16, causal, 6 x 11, N = 8192; B = 1, H = 8, d = 64 and H = 16, d = 128) with
the dK/dV side's scores made queries as rows ("s") or keys as rows ("t", ``mta.conv_backward``'s ``KEYS_AS_ROWS``)
at given tiles (None: the launcher's own choice); gradients compared with the first variant's.

    PYTHONPATH=. python notes/dkdv_transposed/bench_gpu.py

Runs 1 and 2 (``dkdv_transposed_run1.json``, ``_run2.json``) timed an earlier copy of the keys-as-rows kernel
swapped in for the shipped one (the code that became ``_dkdv_query_tiles_keys_as_rows``; it loaded V untransposed).
"""
import json
import os

import torch

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

VARIANTS = {64: [(None, None), ("s", (32, 64, 4, 2)), ("t", (32, 128, 8, 2))], 128: [(None, None)]}
launcher_choice = mta.conv.keys_as_rows_tile
table = dict(tuning.HOPPER["conv_dkdv"])
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for H, D in ((8, 64), (16, 128)):
    torch.manual_seed(0)
    N, cq, ck = 8192, 6, 11
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
    do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
    ref = None
    for kind, tile in VARIANTS[D]:
        if kind == "t":
            mta.conv.keys_as_rows_tile = lambda *a, tile=tile: tuning.as_config(tile)
        elif kind == "s":
            mta.conv.keys_as_rows_tile = lambda *a: None
            tuning.HOPPER["conv_dkdv"] = {key: tile for key in table}

        def step():
            o = mta.conv_attention(q, k, v, w, causal=True)
            return torch.autograd.grad(o, (q, k, v, w), do)
        grads = step()
        ms = time_ms(step, rep=20)
        mta.conv.keys_as_rows_tile, tuning.HOPPER["conv_dkdv"] = launcher_choice, table
        ref = grads if ref is None else ref
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
        print(f"H={H} D={D} {kind or 'launcher'} {tile or ''}: fwd+bwd {ms:.3f} ms; rel diff "
              + " ".join(f"{e:.1e}" for e in errs), flush=True)
        out["rows"].append({"H": H, "D": D, "kind": kind, "tile": tile, "ms": ms, "rel_diff": errs})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "dkdv_transposed.json"), "w"), indent=1)

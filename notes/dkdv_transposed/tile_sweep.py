"""H100: MTA forward + backward (bf16, causal, 6 x 11, N = 8192, B = 1, H = 8, d = 64) with the keys-as-rows
dK/dV tile forced to each of TILES (BLOCK_M, BLOCK_N, warps, stages); the launcher's own choice first and last
(the spread between them is the noise). Gradients compared with the launcher's.

    PYTHONPATH=. TILES='[(64, 128, 8, 1), (64, 128, 8, 2)]' python notes/dkdv_transposed/tile_sweep.py
"""
import json
import os

import torch

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

tiles = [None] + eval(os.environ.get("TILES", "[]")) + [None]
launcher_choice = mta.conv.keys_as_rows_tile
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
torch.manual_seed(0)
H, N, D, cq, ck = 8, 8192, 64, 6, 11
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
ref = None
for tile in tiles:
    mta.conv.keys_as_rows_tile = launcher_choice if tile is None else (lambda *a, tile=tile: tuning.as_config(tile))

    def step():
        o = mta.conv_attention(q, k, v, w, causal=True)
        return torch.autograd.grad(o, (q, k, v, w), do)
    try:
        grads = step()
        ms = time_ms(step, rep=30)
    except Exception as error:  # noqa: BLE001 - a tile that does not compile or launch is a result
        print(f"{tile}: {type(error).__name__}: {str(error)[:200]}", flush=True)
        out["rows"].append({"tile": tile, "error": repr(error)[:300]})
        continue
    finally:
        mta.conv.keys_as_rows_tile = launcher_choice
    ref = grads if ref is None else ref
    errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
    print(f"{tile or 'launcher'}: fwd+bwd {ms:.3f} ms; rel diff " + " ".join(f"{e:.1e}" for e in errs), flush=True)
    out["rows"].append({"tile": tile, "ms": ms, "rel_diff": errs})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tile_sweep.json"), "w"), indent=1)

"""H100: MTA forward + backward (bf16, causal, 6 x 11, N = 8192, B = 1, H = 8, d = 64) with the keys-as-rows
dK/dV tile forced to each of TILES (queries per step, owned keys, warps, stages), two interleaved rounds; the
launcher's own tile (32, 128, 8, 2) first and last in each round. Question: do 64 owned keys over one warpgroup
(two programs per SM: about 113 KB of shared memory each) beat 128 keys over two warpgroups (one program, 174 KB)?
Gradients compared with the launcher's. A tile that does not fit falls back to the chunked backward (~220 ms).

    PYTHONPATH=. python notes/h100_2026-11-24f/dkdv_keys_as_rows_4warps.py
"""
import json
import os

import torch

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

TILES = [(32, 64, 4, 2), (32, 64, 4, 3), (16, 64, 4, 2), (16, 64, 4, 3), (16, 64, 4, 4), (64, 64, 4, 2),
         (16, 128, 8, 3), (32, 64, 8, 2)]
launcher_choice = mta.conv.keys_as_rows_tile
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
torch.manual_seed(0)
H, N, D, cq, ck = 8, 8192, 64, 6, 11
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
ref = None
for rnd in range(2):
    for tile in [None] + TILES + [None]:
        mta.conv.keys_as_rows_tile = launcher_choice if tile is None else (lambda *a, t=tile: tuning.as_config(t))

        def step():
            o = mta.conv_attention(q, k, v, w, causal=True)
            return torch.autograd.grad(o, (q, k, v, w), do)
        try:
            grads = step()
            ms = time_ms(step, rep=30)
        except Exception as error:  # noqa: BLE001 - a tile that does not compile or launch is a result
            print(f"round {rnd} {tile}: {type(error).__name__}: {str(error)[:200]}", flush=True)
            out["rows"].append({"round": rnd, "tile": tile, "error": repr(error)[:300]})
            continue
        finally:
            mta.conv.keys_as_rows_tile = launcher_choice
        ref = grads if ref is None else ref
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
        print(f"round {rnd} {tile or 'launcher'}: fwd+bwd {ms:.3f} ms; rel diff "
              + " ".join(f"{e:.1e}" for e in errs), flush=True)
        out["rows"].append({"round": rnd, "tile": tile, "ms": ms, "rel_diff": errs})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "dkdv_keys_as_rows_4warps.json"), "w"), indent=1)

"""H100: MTA forward + backward (bf16, causal, 6 x 11, N = 8192, B = 1, H = 16, d = 128) with the dK/dV side's
scores made keys as rows at each tile of TILES (BLOCK_M queries, BLOCK_N keys, warps, stages), against the
launcher's own choice (queries as rows at d = 128), first and last (their spread is the noise). Gradients compared
with the launcher's. ``WARM=1``: compile the tiles in parallel processes first (one per tile, shared Triton cache).

    PYTHONPATH=. TILES='[(32, 64, 8, 1)]' python notes/h100_2026-11-24c/dkdv_keys_as_rows_d128.py
"""
import json
import os
import subprocess
import sys

import torch

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

H, N, D, cq, ck = int(os.environ.get("H", 16)), 8192, int(os.environ.get("D", 128)), 6, 11
tiles = eval(os.environ.get("TILES", "[]"))
if os.environ.get("WARM") == "1":  # compile side by side, then time in this process from the cache
    env = {**os.environ, "WARM": "0", "ONLY_COMPILE": "1"}
    procs = [subprocess.Popen([sys.executable, __file__], env={**env, "TILES": repr([t])}) for t in tiles]
    for p in procs:
        p.wait()
only_compile = os.environ.get("ONLY_COMPILE") == "1"
launcher_choice = mta.conv.keys_as_rows_tile
out = {"gpu": torch.cuda.get_device_name(), "H": H, "N": N, "D": D, "rows": []}
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
ref = None
for tile in ((tiles or [None]) if only_compile else [None] + tiles + [None]):
    mta.conv.keys_as_rows_tile = launcher_choice if tile is None else (lambda *a, tile=tile: tuning.as_config(tile))

    def step():
        o = mta.conv_attention(q, k, v, w, causal=True)
        return torch.autograd.grad(o, (q, k, v, w), do)
    try:
        grads = step()
        if only_compile:
            continue
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
if not only_compile:
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"dkdv_keys_as_rows_d{D}_{os.environ.get('TAG', '0')}.json"), "w"), indent=1)

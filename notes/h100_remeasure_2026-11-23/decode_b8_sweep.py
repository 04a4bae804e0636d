"""B = 8 decode, where SDPA was 0.3-1.1% faster (d = 64 at 64k and 128k keys, d = 128 at 32k; bench_decode.json at
8f93bb9, 2 splits): time the split count and the key tile around the table's, beside SDPA, as the bench times them
(two interleaved rounds; the smaller median counts).

    PYTHONPATH=. OUT=. python notes/h100_remeasure_2026-11-23/decode_b8_sweep.py
"""
import json
import os

import torch

import mta
import mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
TILES = {64: [(128, 4, 3), (128, 4, 4), (64, 4, 4), (256, 8, 3), (128, 8, 3)],
         128: [(64, 4, 3), (64, 4, 4), (128, 8, 3), (64, 8, 4), (128, 4, 2)]}
base = dict(dec.TILES)
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
    for N in (16384, 32768, 65536, 131072):
        x = random_inputs(DecodeShape("bfloat16", 8, H, Hkv, D, N), dev)
        variants = [("sdpa", lambda: sdpa(x))]
        for tile in TILES[D]:
            for s in (2, 3, 4):
                def call(tile=tile, s=s):
                    dec.TILES = {**base, D: tile}
                    return mta.decode_attention(x["q"], x["k"], x["v"], num_splits=s)
                variants.append((f"{tile} s={s}", call))
        ms = {}
        for rnd in range(2):
            for name, fn in variants:
                t = time_ms(fn, rep=40)
                ms[name] = min(ms.get(name, t), t)
        dec.TILES = base
        best = sorted(ms.items(), key=lambda kv: kv[1])[:5]
        print(H, Hkv, D, N, "sdpa", round(ms["sdpa"] * 1e3, 1), "table", round(ms[f"{TILES[D][0]} s=2"] * 1e3, 1),
              "best", [(k, round(v * 1e3, 1)) for k, v in best], flush=True)
        out["rows"].append({"H": H, "Hkv": Hkv, "D": D, "N": N, "ms": ms})
        del x
        torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_b8_sweep.json"), "w"), indent=1)

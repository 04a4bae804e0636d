"""Decode key tiles not tried before (256 keys over 4 warps, 2 warps), at the shapes where SDPA leads (B = 8: d = 64
at 32k-128k keys, d = 128 at 32k-64k) and at B = 1 (to see what a table change would cost there), beside SDPA, as
the bench times them (two interleaved rounds; the smaller median counts). The rule's split count throughout.

    PYTHONPATH=. OUT=. python notes/h100_2026-11-24d/decode_tiles.py
"""
import json
import os

import torch

import mta
import mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
TILES = {64: [(128, 4, 3), (256, 4, 2), (256, 4, 3), (128, 2, 3), (64, 2, 4), (128, 4, 2)],
         128: [(64, 4, 3), (128, 4, 2), (128, 4, 3), (64, 2, 3), (32, 4, 4), (64, 4, 2)]}
SHAPES = [(8, 8, 8, 64, n) for n in (32768, 65536, 131072)] + [(8, 32, 8, 128, n) for n in (32768, 65536)] + \
         [(1, 8, 8, 64, n) for n in (16384, 131072)] + [(1, 32, 8, 128, n) for n in (16384, 131072)]
base = dict(dec.TILES)
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for (B, H, Hkv, D, N) in SHAPES:
    x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
    ref = sdpa(x).float()
    variants = [("sdpa", lambda: sdpa(x))]
    for tile in TILES[D]:
        def call(tile=tile):
            dec.TILES = {**base, D: tile}
            try:
                return mta.decode_attention(x["q"], x["k"], x["v"])
            finally:
                dec.TILES = base
        err = ((call().float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (tile, err)
        variants.append((str(tile), call))
    ms = {}
    for rnd in range(2):
        for name, fn in variants:
            t = time_ms(fn, rep=40)
            ms[name] = min(ms.get(name, t), t)
    best = sorted(ms.items(), key=lambda kv: kv[1])[:4]
    print(B, H, Hkv, D, N, "sdpa", round(ms["sdpa"] * 1e3, 1), "table", round(ms[str(TILES[D][0])] * 1e3, 1),
          "best", [(k, round(v * 1e3, 1)) for k, v in best], flush=True)
    out["rows"].append({"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "ms": ms})
    del x
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_tiles.json"), "w"), indent=1)

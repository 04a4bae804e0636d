"""Plain decode with its whole key tiles through the copy engine (TMA descriptors, `mta.decode.USE_TMA`) against
the pointer loads and SDPA, at the bench's shapes (bf16, Nq = 1, B in {1, 8}), a few tiles for the TMA path. Two
interleaved rounds per shape, the smaller median counts (as `decode_b8_sweep.py`). Runs at 4d8512a, the commit that
added `USE_TMA` (reverted in the next one).

    PYTHONPATH=. OUT=. python notes/h100_2026-11-24b/decode_tma.py
"""
import json
import os

import torch

import mta
import mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
TILES = {64: [(128, 4, 3), (128, 4, 4), (256, 8, 3)], 128: [(64, 4, 3), (64, 4, 4), (128, 8, 3)]}
base = dict(dec.TILES)
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for B in (1, 8):
    for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
        for N in (4096, 16384, 32768, 65536, 131072):
            x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
            ref = sdpa(x)
            variants = [("sdpa", None, None)] + [("ptr", TILES[D][0], False)] + \
                       [(f"tma {t}", t, True) for t in TILES[D]]
            ms = {}
            for rnd in range(2):
                for name, tile, tma in variants:
                    if tile is None:
                        fn = lambda: sdpa(x)
                    else:
                        def fn(tile=tile, tma=tma):
                            dec.TILES, dec.USE_TMA = {**base, D: tile}, tma
                            return mta.decode_attention(x["q"], x["k"], x["v"])
                        if rnd == 0:
                            err = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
                            assert err < 2e-2, (name, err)
                    t = time_ms(fn, rep=40)
                    ms[name] = min(ms.get(name, t), t)
            dec.TILES, dec.USE_TMA = base, True
            us = {k: round(v * 1e3, 1) for k, v in ms.items()}
            print(B, H, Hkv, D, N, us, "sdpa/tma0", round(ms["sdpa"] / ms[f"tma {TILES[D][0]}"], 4),
                  "sdpa/ptr", round(ms["sdpa"] / ms["ptr"], 4), flush=True)
            out["rows"].append({"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "ms": ms})
            del x, ref
            torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_tma.json"), "w"), indent=1)

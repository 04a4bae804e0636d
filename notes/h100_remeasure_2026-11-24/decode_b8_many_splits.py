"""B = 8 decode where SDPA was 0.3-1.1% faster in the committed run (2 splits: 128 programs on 132 SMs): many more
splits (several waves, two programs per SM), beside SDPA, as the bench times them (three interleaved rounds; the
smallest median counts).

    PYTHONPATH=. OUT=. python notes/h100_remeasure_2026-11-24/decode_b8_many_splits.py
"""
import json
import os

import torch

import mta
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
SPLITS = (2, 4, 8, 12, 16, 24, 33, 66)
out = {"gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
       "rows": []}
for (H, Hkv, D, N) in ((8, 8, 64, 16384), (8, 8, 64, 65536), (8, 8, 64, 131072), (32, 8, 128, 32768),
                       (32, 8, 128, 131072)):
    x = random_inputs(DecodeShape("bfloat16", 8, H, Hkv, D, N), dev)
    variants = [("sdpa", lambda: sdpa(x)), ("rule", lambda: mta.decode_attention(x["q"], x["k"], x["v"]))]
    variants += [(f"s={s}", lambda s=s: mta.decode_attention(x["q"], x["k"], x["v"], num_splits=s)) for s in SPLITS]
    ms = {}
    for rnd in range(3):
        for name, fn in variants:
            t = time_ms(fn, rep=40)
            ms[name] = min(ms.get(name, t), t)
    best = sorted(ms.items(), key=lambda kv: kv[1])[:5]
    print(H, Hkv, D, N, "sdpa", round(ms["sdpa"] * 1e3, 1), "rule", round(ms["rule"] * 1e3, 1),
          "best", [(k, round(v * 1e3, 1)) for k, v in best], flush=True)
    out["rows"].append({"B": 8, "H": H, "Hkv": Hkv, "D": D, "N": N, "ms": ms})
    del x
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_b8_many_splits.json"), "w"), indent=1)

"""Hypothesis (not yet measured): at B = 1, N >= 32k the split rule picks 14 splits x 8 kv heads = 112 programs on
132 SMs, and plain decode streams slower than SDPA there; at B = 8 the same kernel with 128 programs reaches
3.17 TB/s marginal against 2.84 at B = 1 (ratio 0.90, programs ratio 112/128 = 0.875). Time decode_attention with
the rule's count and with the count that fills one wave best, beside SDPA and the read, as the bench times them.

    PYTHONPATH=. OUT=. python notes/h100_remeasure_2026-11-23/decode_fill_splits.py
"""
import json
import os

import torch

import mta
import mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
sms = dec.sm_count(dev)
out = {"gpu": torch.cuda.get_device_name(), "sms": sms, "rows": []}
for B in (1, 8):
    for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
        block_n = dec.TILES[D][0]
        for N in (16384, 32768, 65536, 131072):
            x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
            rule = dec.choose_num_splits(B * Hkv, N, block_n, sms)
            one_wave = max(1, sms // (B * Hkv))  # the most splits that still run in a single wave
            counts = sorted({rule, one_wave, max(1, one_wave - 1)})
            row = {"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "rule": rule, "ms": {}}
            for rnd in range(2):  # two interleaved rounds; the minimum of the medians counts
                for name, fn in [("sdpa", lambda: sdpa(x)), ("read", lambda: (x["k"].sum(), x["v"].sum()))] + [
                        (f"s={s}", lambda s=s: mta.decode_attention(x["q"], x["k"], x["v"], num_splits=s))
                        for s in counts]:
                    t = time_ms(fn, rep=50)
                    row["ms"][name] = min(row["ms"].get(name, t), t)
            print(B, H, Hkv, D, N, "rule", rule, {k: round(v * 1e3, 1) for k, v in row["ms"].items()}, flush=True)
            out["rows"].append(row)
            del x
            torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_fill_splits.json"), "w"), indent=1)

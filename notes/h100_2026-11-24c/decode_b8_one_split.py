"""H100: at B = 8 plain decode trails SDPA by 0.3-1.1% at three of the bench's shapes (2 splits: 128 programs and a
merge). Earlier sweeps tried 2-66 splits, never 1 (64 programs, no merge kernel at all). Time 1, 2 and 3 splits
and the rule's count beside SDPA, three interleaved rounds, the minimum of the medians.

    PYTHONPATH=. OUT=. python notes/h100_2026-11-24c/decode_b8_one_split.py
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
for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
    for N in (16384, 32768, 65536, 131072):
        x = random_inputs(DecodeShape("bfloat16", 8, H, Hkv, D, N), dev)
        row = {"B": 8, "H": H, "Hkv": Hkv, "D": D, "N": N, "ms": {}}
        ref = mta.decode_attention(x["q"], x["k"], x["v"])
        calls = [("sdpa", lambda: sdpa(x)), ("rule", lambda: mta.decode_attention(x["q"], x["k"], x["v"]))]
        calls += [(f"s={s}", lambda s=s: mta.decode_attention(x["q"], x["k"], x["v"], num_splits=s)) for s in (1, 2, 3)]
        for name, fn in calls[2:]:
            err = ((fn().float() - ref.float()).norm() / ref.float().norm()).item()
            assert err < 1e-2, (name, err)
        for rnd in range(3):
            for name, fn in calls:
                t = time_ms(fn, rep=50)
                row["ms"][name] = min(row["ms"].get(name, t), t)
        print(8, H, Hkv, D, N, {k: round(v * 1e3, 1) for k, v in row["ms"].items()},
              "sdpa/best-of-ours", round(row["ms"]["sdpa"] / min(v for k, v in row["ms"].items() if k != "sdpa"), 4),
              flush=True)
        out["rows"].append(row)
        del x
        torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_b8_one_split.json"), "w"), indent=1)

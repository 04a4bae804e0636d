"""H100: does starting each split's key walk at a rotated tile (``mta.decode.ROTATE_WALK``: tile
``(program_id(1) * 7 + split * 3) % tiles`` first, then on, wrapping) beat every split starting at its first tile,
at the bench's N >= 16k shapes? bf16, Nq = 1, plain decode and MTA decode (6 x 11), beside SDPA; three interleaved
rounds, the minimum of the medians.

    PYTHONPATH=. OUT=. python notes/h100_2026-11-24c/decode_rotated_walk.py
"""
import json
import os

import torch

import mta
import mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for B in (1, 8):
    for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
        for N in (16384, 65536, 131072):
            x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
            row = {"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "us": {}}

            def dec_call(rotate, fn):
                def call():
                    dec.ROTATE_WALK = rotate
                    return fn()
                return call
            plain = lambda: mta.decode_attention(x["q"], x["k"], x["v"])
            conv = lambda: mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"])
            calls = [("sdpa", lambda: sdpa(x)), ("plain", dec_call(False, plain)), ("plain_rot", dec_call(True, plain)),
                     ("mta", dec_call(False, conv)), ("mta_rot", dec_call(True, conv))]
            for a, b in (("plain", "plain_rot"), ("mta", "mta_rot")):
                ra, rb = dict(calls)[a]().float(), dict(calls)[b]().float()
                assert ((ra - rb).norm() / ra.norm()).item() < 1e-2
            for rnd in range(3):
                for name, fn in calls:
                    t = time_ms(fn, rep=50) * 1e3
                    row["us"][name] = min(row["us"].get(name, t), t)
            u = row["us"]
            print(B, H, Hkv, D, N, {k: round(v, 1) for k, v in u.items()},
                  f"plain rot/not {u['plain_rot'] / u['plain']:.4f}  mta rot/not {u['mta_rot'] / u['mta']:.4f}  "
                  f"sdpa/plain {u['sdpa'] / u['plain']:.4f}  sdpa/plain_rot {u['sdpa'] / u['plain_rot']:.4f}", flush=True)
            out["rows"].append(row)
            del x
            torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_rotated_walk.json"), "w"), indent=1)

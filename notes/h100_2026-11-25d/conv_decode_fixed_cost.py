"""H100: where MTA decode's fixed cost at short caches goes (bf16, Nq = 1, B = 1). conv_decode_attention with
kernels 6 x 11 (the bench's), 1 x 11 (band: 1 kernel row, 11 gathers), 6 x 1 (band of 5 keys, no gathers) and
1 x 1 (no band), beside decode_attention, at 1k-16k keys; the rule's split count. Two interleaved rounds, the
smaller median of each. Question: is the band program (cq * ck dependent gathers) the critical path at short N?

    PYTHONPATH=. python notes/h100_2026-11-25d/conv_decode_fixed_cost.py
"""
import json
import os

import torch

import mta
from mta.bench.timing import time_ms

KERNELS = [(6, 11), (1, 11), (6, 1), (1, 1), (11, 11), (3, 3)]
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for hq, hkv, d in [(32, 8, 128), (8, 8, 64)]:
    for n in [1024, 2048, 4096, 16384]:
        torch.manual_seed(0)
        q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        calls = {"decode": lambda: mta.decode_attention(q[:, :, -1:], k, v)}
        for cq, ck in KERNELS:
            w = 0.2 * torch.randn(hq, cq, ck, device="cuda")
            calls[f"{cq}x{ck}"] = lambda w=w: mta.conv_decode_attention(q, k, v, w)
        best = {}
        for _ in range(2):
            for name, fn in calls.items():
                fn()
                best[name] = min(best.get(name, 1e9), time_ms(fn, rep=200) * 1e3)
        row = {"heads": hq, "kv_heads": hkv, "head_dim": d, "seq_len": n, "us": best}
        out["rows"].append(row)
        print(f"Hq={hq} Hkv={hkv} d={d} N={n}: " + " ".join(f"{k} {v:.1f}" for k, v in best.items())
              + " | 6x11/decode %.2f" % (best["6x11"] / best["decode"]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "conv_decode_fixed_cost.json"), "w"), indent=1)

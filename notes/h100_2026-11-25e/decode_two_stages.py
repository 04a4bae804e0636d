"""Plain decode with two pipeline stages (not in earlier sweeps, where 3 < 4 < 5 stages at B = 8), beside the
table's tile and SDPA, through the bench's timer. bf16, Nq = 1. Two interleaved rounds; the smaller of the two
medians counts. Variants patch ``mta.tuning.DECODE`` (the launcher reads the same dict) and pass ``num_splits``
(None: the rule's count)."""
import json
import os
import sys

import torch
import torch.nn.functional as F

import mta
import mta.decode as md
from mta import tuning
from mta.bench.timing import time_ms

SHAPES = [(1, 8, 8, 64, n) for n in (4096, 32768, 131072)] + [(8, 8, 8, 64, n) for n in (4096, 16384, 32768, 65536, 131072)] \
    + [(1, 32, 8, 128, n) for n in (4096, 131072)] + [(8, 32, 8, 128, n) for n in (4096, 32768, 65536)]
VARIANTS = {64: [((128, 4, 3), None), ((128, 4, 2), None), ((128, 4, 2), "x2"), ((64, 4, 2), None)],
            128: [((64, 4, 3), None), ((64, 4, 2), None), ((64, 4, 2), "x2")]}
table = dict(tuning.DECODE)
rows = []
for B, Hq, Hkv, D, N in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)
    ref = sdpa().float()
    times = {}
    for rnd in range(2):
        times.setdefault("sdpa", []).append(time_ms(sdpa, warmup=10, rep=30) * 1e3)
        for tile, splits in VARIANTS[D]:
            tuning.DECODE[D] = tile
            s = None
            if splits == "x2":  # twice the rule's count for this tile (one row tile per kv head here)
                s = 2 * md.choose_num_splits(B * Hkv, N, tile[0], md.sm_count(q.device))
            name = f"{tile} s={splits or 'rule'}"
            out = mta.decode_attention(q, k, v, num_splits=s)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            times.setdefault(name, []).append(time_ms(lambda: mta.decode_attention(q, k, v, num_splits=s),
                                                      warmup=10, rep=30) * 1e3)
            times.setdefault(name + " err", [err])
        tuning.DECODE.update(table)
    best = {n: min(t) for n, t in times.items()}
    rows.append({"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "N": N, "us": best})
    line = "  ".join(f"{n} {t:.1f}" if "err" not in n else f"err {t:.1e}" for n, t in best.items())
    print(f"B={B} Hq={Hq} D={D} N={N}: {line}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(os.environ.get("OUT", ".") + "/decode_two_stages.json", "w"), indent=1)

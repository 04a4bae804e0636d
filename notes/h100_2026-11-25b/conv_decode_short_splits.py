"""conv_decode_attention (6 x 11) against decode_attention at B = 1 and short caches (1k-8k keys), bf16, Nq = 1:
the rule's split count against fixed counts, through the public num_splits. Times: mta.bench.timing.time_ms
(median of 50, L2 flushed, launch overhead excluded), two interleaved rounds; the minimum of the two medians."""
import json
import sys

import torch

import mta
from mta import decode as dec
from mta.bench.timing import time_ms

torch.manual_seed(0)
picked = []
rule = dec.choose_num_splits
dec.choose_num_splits = lambda *a, **k: picked.append(rule(*a, **k)) or picked[-1]
out = []
for hq, hkv, d in ((8, 8, 64), (32, 8, 128)):
    for n in (1024, 2048, 4096, 8192):
        q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = 0.2 * torch.randn(hq, 6, 11, device="cuda")
        qn = q[:, :, -1:].contiguous()
        calls = {"decode": lambda: mta.decode_attention(qn, k, v)}
        for s in (None, 1, 2, 4, 6, 8, 12, 16, 24, 32):
            calls[f"conv s={s}"] = (lambda s=s: mta.conv_decode_attention(q, k, v, w, num_splits=s))
        picked.clear()
        mta.conv_decode_attention(q, k, v, w)
        rule_splits = picked[-1] if picked else None
        times = {name: [] for name in calls}
        for _ in range(2):
            for name, fn in calls.items():
                times[name].append(time_ms(fn, warmup=10, rep=50) * 1e3)
        best = {name: min(t) for name, t in times.items()}
        row = {"heads": hq, "kv_heads": hkv, "head_dim": d, "seq_len": n, "rule_splits": rule_splits, "us": best}
        out.append(row)
        base = best["decode"]
        print(f"Hq={hq} D={d} N={n} rule={rule_splits} decode {base:.1f} us | " + " ".join(
            f"{name.split()[-1]}:{t / base:.2f}" for name, t in best.items() if name != "decode"), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

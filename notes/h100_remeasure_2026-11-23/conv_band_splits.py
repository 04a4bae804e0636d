"""Conv decode (6x11, bf16, Nq=1): split counts around the rule, counting the band program or not."""
import json, os
import torch
import mta, mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs
from mta.bench.timing import time_ms
dev = torch.device("cuda")
slots = dec.sm_count(dev) * dec.MTA_PROGRAMS_PER_SM
rows = []
for B, H, Hkv, D in [(1, 8, 8, 64), (1, 32, 8, 128), (8, 8, 8, 64), (8, 32, 8, 128)]:
    for N in (4096, 8192, 16384, 65536):
        x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
        t_dec = time_ms(lambda: mta.decode_attention(x["q"], x["k"], x["v"]), rep=40)
        p = B * Hkv
        fit = max(1, slots // p - 1)
        cands = sorted({fit, fit + 1, max(1, fit // 2), 2 * fit + 1, 4 * fit + 3, 4, 8, 16})
        res = {}
        for rnd in range(2):
            for ns in [None] + cands:
                f = lambda: mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"], num_splits=ns)
                t = time_ms(f, rep=40)
                res[str(ns)] = min(res.get(str(ns), 1e9), t)
        best = min(res, key=res.get)
        print(f"B={B} D={D} N={N}: decode {t_dec*1e3:.1f} default {res['None']*1e3:.1f} ({res['None']/t_dec:.2f}x) "
              f"fit={fit}: {res[str(fit)]*1e3:.1f} ({res[str(fit)]/t_dec:.2f}x) best {best}: {res[best]*1e3:.1f} "
              f"({res[best]/t_dec:.2f}x) | " + " ".join(f"{k}:{v*1e3:.1f}" for k, v in res.items()), flush=True)
        rows.append(dict(B=B, H=H, Hkv=Hkv, D=D, N=N, decode=t_dec, conv=res, fit=fit))
        del x; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ["OUT"], "conv_band_splits.json"), "w"), indent=1)

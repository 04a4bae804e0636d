# python notes/h100_2026-11-25i/serving_sweep.py OUT.json   (GPU; from the repository root)
"""Decode where a server runs it: many sequences, short caches. bf16, Nq = 1, B in {16, 32, 64, 128},
N in {1k, 2k, 4k, 8k}, (Hq, Hkv, D) in {(8, 8, 64), (32, 8, 128)}: decode_attention, conv_decode_attention
(6 x 11) and SDPA (enable_gqa), event timing (mta.bench.timing.time_ms), two rounds; which kernel and grid
decode_attention launched (recorded through mta.decode.launch)."""
import json
import sys

import torch
import torch.nn.functional as F

import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
launched = []
orig_launch = dec.launch


def recording_launch(kernel, grid, *args, **kw):
    launched.append((getattr(kernel, "__name__", None) or kernel.fn.__name__, tuple(grid)))
    return orig_launch(kernel, grid, *args, **kw)


dec.launch = recording_launch
rows = []
for Hq, Hkv, D in ((8, 8, 64), (32, 8, 128)):
    for B in (16, 32, 64, 128):
        for N in (1024, 2048, 4096, 8192):
            torch.manual_seed(0)
            q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
            qc = torch.randn(B, Hq, N, D, device=dev, dtype=torch.bfloat16)
            w = torch.randn(Hq, 6, 11, device=dev) * 0.2
            nb = 2 * k.numel() * 2
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
            launched.clear()
            err = ((mta.decode_attention(q, k, v).float() - ref).norm() / ref.norm()).item()
            path = list(launched)
            assert err < 2e-2, err
            fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv),
                   "decode": lambda: mta.decode_attention(q, k, v),
                   "conv_decode": lambda: mta.conv_decode_attention(qc, k, v, w)}
            best = {}
            for rnd in range(2):
                for name, fn in fns.items():
                    ms = time_ms(fn, warmup=5, rep=30)
                    best[name] = min(best.get(name, 9e9), ms)
            rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, path=path, **{f"{n}_us": t * 1e3 for n, t in best.items()}))
            print(f"B{B:3d} Hq{Hq} d{D} N{N:5d}  sdpa {best['sdpa']*1e3:7.1f}  decode {best['decode']*1e3:7.1f} "
                  f"({nb / best['decode'] / 1e9:.2f} TB/s)  conv {best['conv_decode']*1e3:7.1f}  "
                  f"sdpa/decode {best['sdpa'] / best['decode']:.3f}  conv/decode {best['conv_decode'] / best['decode']:.3f}"
                  f"  {path}", flush=True)
            del q, k, v, qc
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

# python notes/h100_2026-11-25i/interleaved_tiles.py OUT.json   (GPU; from the repository root)
"""With interleaved splits, is another plain decode tile better than the table's at the benchmark's long caches?
bf16, Nq = 1, B in {1, 8}, 16k-128k keys, the rule's split count, tiles forced through mta.decode.decode_tile,
beside SDPA; event timing, three rounds (order rotated), the smallest median counts."""
import json
import sys

import torch
import torch.nn.functional as F

import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
orig_tile = dec.decode_tile
TILES = {64: [(128, 4, 3), (128, 4, 4), (256, 4, 3), (256, 4, 2), (64, 4, 4), (128, 8, 3)],
         128: [(64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 4, 2), (32, 4, 4)]}
rows = []
for B in (8, 1):
    for Hq, Hkv, D in ((8, 8, 64), (32, 8, 128)):
        for N in (16384, 32768, 65536, 131072):
            torch.manual_seed(0)
            q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
            impls = {"sdpa": None, **{str(t): t for t in TILES[D]}}
            for name, tile in impls.items():
                if tile:
                    dec.decode_tile = lambda *a, tile=tile, **kw: tile
                    err = ((mta.decode_attention(q, k, v).float() - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, (tile, err)
            best = {}
            names = list(impls)
            for rnd in range(3):
                for name in names[rnd:] + names[:rnd]:
                    tile = impls[name]
                    if tile is None:
                        dec.decode_tile = orig_tile
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)
                    else:
                        dec.decode_tile = lambda *a, tile=tile, **kw: tile
                        fn = lambda: mta.decode_attention(q, k, v)
                    best[name] = min(best.get(name, 9e9), time_ms(fn, warmup=5, rep=30))
            dec.decode_tile = orig_tile
            sd = best["sdpa"]
            rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, **{f"{n}_us": t * 1e3 for n, t in best.items()}))
            print(f"B{B} d{D:3d} N{N:6d} sdpa {sd * 1e3:7.1f} | " + "  ".join(
                f"{n} {sd / t:.4f}" for n, t in best.items() if n != "sdpa"), flush=True)
            del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

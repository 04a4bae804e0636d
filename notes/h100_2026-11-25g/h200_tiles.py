"""H200: decode_attention at B = 8 with more bytes in flight per SM (stages, tile, two programs an SM through more
splits) against SDPA. bf16, Nq = 1; event timing as the benchmark."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
orig_tile = dec.decode_tile
rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 16384), (8, 8, 8, 64, 65536), (8, 32, 8, 128, 16384), (8, 32, 8, 128, 65536),
                         (1, 8, 8, 64, 65536), (1, 32, 8, 128, 65536)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    sd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), warmup=5, rep=30) * 1e3
    res = []
    tiles = ([(128, 4, 3), (128, 4, 4), (128, 4, 5), (256, 4, 3), (256, 8, 3), (64, 4, 6)] if D == 64 else
             [(64, 4, 3), (64, 4, 4), (64, 4, 5), (128, 4, 3), (128, 8, 3), (32, 4, 6)])
    for tile in tiles:
        dec.decode_tile = lambda bd, dt, tile=tile: tile
        for s in ((None, 2, 4, 8) if B == 8 else (None, 32)):
            fn = lambda s=s: mta.decode_attention(q, k, v, num_splits=s)
            try:
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, err
                us = time_ms(fn, warmup=5, rep=30) * 1e3
            except Exception as e:
                print(tile, s, type(e).__name__, str(e)[:120], flush=True)
                continue
            res.append((us, tile, s))
            rows.append(dict(B=B, Hq=Hq, D=D, N=N, tile=tile, splits=s, us=us, sdpa_us=sd))
    dec.decode_tile = orig_tile
    print(f"B{B} Hq{Hq} d{D} N{N}: sdpa {sd:.1f} us ({nb / sd / 1e6:.2f} TB/s); shipped "
          f"{[r for r in res if r[1] == tiles[0] and r[2] is None][0][0]:.1f}; best: " +
          "; ".join(f"{t} s={s} {us:.1f}" for us, t, s in sorted(res)[:6]), flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

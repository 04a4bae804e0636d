"""Many short splits: can decode_attention use all 132 SMs at 64 (batch, kv head) pairs by making the programs a
whole number of waves (64 x 33 = 2112 = 16 x 132)? bf16, Nq = 1; event timing as the benchmark (L2 flushed);
SDPA beside; two tiles (3 stages: two programs an SM; 2 stages: three)."""
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
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 8, 8, 64, 32768), (8, 32, 8, 128, 32768),
                         (8, 32, 8, 128, 65536)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    base_tile = orig_tile(D, torch.bfloat16)
    for rnd in range(2):
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), warmup=5, rep=40)
        rows.append(dict(B=B, Hq=Hq, D=D, N=N, impl="sdpa", round=rnd, us=ms * 1e3))
        print(f"B{B} Hq{Hq} d{D} N{N} sdpa r{rnd} {ms * 1e3:.1f} us {nb / ms / 1e9:.3f} TB/s", flush=True)
        for tile in (base_tile, base_tile[:2] + (2,)):
            dec.decode_tile = lambda bd, dt, tile=tile: tile
            for s in (2, 4, 16, 33, 66):
                fn = lambda s=s: mta.decode_attention(q, k, v, num_splits=s)
                if rnd == 0:
                    err = ((fn().float() - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, err
                ms = time_ms(fn, warmup=5, rep=40)
                rows.append(dict(B=B, Hq=Hq, D=D, N=N, impl="decode", tile=tile, splits=s, round=rnd, us=ms * 1e3))
                print(f"B{B} Hq{Hq} d{D} N{N} decode {tile} s={s} r{rnd} {ms * 1e3:.1f} us {nb / ms / 1e9:.3f} TB/s",
                      flush=True)
        dec.decode_tile = orig_tile
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

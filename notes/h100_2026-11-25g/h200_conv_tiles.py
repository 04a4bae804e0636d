"""H200: conv_decode_attention (6 x 11) at B = 8 with other key tiles and split counts, against decode_attention
(at the code's tiles) and SDPA. bf16, Nq = 1; event timing as the benchmark."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
import mta.decode as dec
from mta.bench.timing import time_ms
from mta.bench import decode as bd

dev = torch.device("cuda")
orig_tile = dec.decode_tile
rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 16384), (8, 8, 8, 64, 65536), (8, 32, 8, 128, 16384), (8, 32, 8, 128, 65536)):
    x = bd.random_inputs(bd.DecodeShape("bfloat16", B, Hq, Hkv, D, N), dev)
    ref = bd.last_rows_reference(x["q_cache"], x["k"], x["v"], x["weight"]).float()
    dec_us = time_ms(lambda: mta.decode_attention(x["q"], x["k"], x["v"]), warmup=5, rep=30) * 1e3
    res = []
    tiles = ([(128, 4, 3), (256, 4, 3), (128, 4, 4), (128, 8, 3), (256, 8, 3), (64, 4, 4)] if D == 64 else
             [(64, 4, 3), (128, 4, 3), (64, 4, 4), (64, 8, 3), (128, 8, 3), (32, 4, 4)])
    for tile in tiles:
        dec.decode_tile = lambda bd_, dt, plain=False, device=None, tile=tile: tile if not plain else orig_tile(bd_, dt, plain, device)
        for s in (None, 2, 3, 4, 6, 8):
            fn = lambda s=s: mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"], num_splits=s)
            try:
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, err
                us = time_ms(fn, warmup=5, rep=30) * 1e3
            except Exception as e:
                print(tile, s, type(e).__name__, str(e)[:120], flush=True)
                continue
            res.append((us, tile, s))
            rows.append(dict(B=B, Hq=Hq, D=D, N=N, tile=tile, splits=s, us=us, decode_us=dec_us))
    dec.decode_tile = orig_tile
    shipped = [r for r in res if r[1] == tiles[0] and r[2] is None][0][0]
    print(f"B{B} Hq{Hq} d{D} N{N}: decode {dec_us:.1f} us; conv shipped {shipped:.1f} ({shipped / dec_us:.2f}x); best: " +
          "; ".join(f"{t} s={s} {us:.1f} ({us / dec_us:.2f}x)" for us, t, s in sorted(res)[:5]), flush=True)
    del x
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

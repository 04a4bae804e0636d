"""H200: conv_decode_attention (6 x 11, d = 64) with shorter key tiles, deeper pipelines and more splits, against
decode_attention (shipped) at the shapes where it takes 1.37-1.43x decode's time (the bar is 1.3x). bf16, Nq = 1;
event timing as the benchmark, best of two rounds for the shipped and the five best."""
import json
import sys
import torch
import mta
import mta.decode as dec
from mta.bench.timing import time_ms
from mta.bench import decode as bd

dev = torch.device("cuda")
orig_tile = dec.decode_tile
rows = []
TILES = [(128, 4, 3), (64, 4, 4), (64, 4, 5), (64, 4, 3), (64, 8, 4), (32, 4, 4), (32, 4, 6)]
for B, N in ((8, 16384), (8, 65536), (8, 131072), (1, 131072), (8, 4096)):
    x = bd.random_inputs(bd.DecodeShape("bfloat16", B, 8, 8, 64, N), dev)
    ref = bd.last_rows_reference(x["q_cache"], x["k"], x["v"], x["weight"]).float()
    plain = lambda: mta.decode_attention(x["q"], x["k"], x["v"])
    dec_us = min(time_ms(plain, warmup=5, rep=30), time_ms(plain, warmup=2, rep=30)) * 1e3
    res = []
    for tile in TILES:
        dec.decode_tile = lambda bd_, dt, plain=False, device=None, n_max=0, tile=tile: (
            tile if not plain else orig_tile(bd_, dt, plain, device, n_max))
        for s in ((None, 8, 12, 16, 24) if B == 8 else (None, 32, 48, 64, 96)):
            fn = lambda s=s: mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"], num_splits=s)
            try:
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, err
                us = time_ms(fn, warmup=5, rep=30) * 1e3
            except Exception as e:
                print(tile, s, type(e).__name__, str(e)[:120], flush=True)
                continue
            res.append([us, tile, s, fn])
    dec.decode_tile = orig_tile
    res.sort(key=lambda r: r[0])
    shipped = [r for r in res if r[1] == TILES[0] and r[2] is None][0]
    for r in res[:5] + [shipped]:  # a second round for the candidates
        tile = r[1]
        dec.decode_tile = lambda bd_, dt, plain=False, device=None, n_max=0, tile=tile: (
            tile if not plain else orig_tile(bd_, dt, plain, device, n_max))
        r[0] = min(r[0], time_ms(r[3], warmup=5, rep=30) * 1e3)
        dec.decode_tile = orig_tile
    for us, tile, s, _ in res:
        rows.append(dict(B=B, D=64, N=N, tile=tile, splits=s, us=us, decode_us=dec_us))
    res.sort(key=lambda r: r[0])
    print(f"B{B} d64 N{N}: decode {dec_us:.1f} us; conv shipped {shipped[0]:.1f} ({shipped[0] / dec_us:.3f}x); best: " +
          "; ".join(f"{t} s={s} {us:.1f} ({us / dec_us:.3f}x)" for us, t, s, _ in res[:6]), flush=True)
    del x
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

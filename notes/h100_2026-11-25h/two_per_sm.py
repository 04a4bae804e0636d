"""cuDNN's split decode kernel at B = 8 runs 256 CTAs (4 splits of 64 (batch, head) pairs), two an SM, 45 KB (d = 64)
or 86 KB (d = 128) of shared memory each; ours 2 splits, one program an SM, 72 KB. Does our kernel with 4 splits and
a lighter tile (two programs an SM) stream as fast? ``mta.decode.decode_tile`` patched to return each tile; event
timing (L2 flushed), two rounds, SDPA beside; bf16, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
shipped = dec.decode_tile
rows = []
SHAPES = ((8, 8, 8, 64, 65536), (8, 8, 8, 64, 32768), (8, 32, 8, 128, 32768), (8, 8, 8, 64, 131072),
          (1, 8, 8, 64, 65536), (8, 8, 8, 64, 8192))
TILES = {64: [None, (128, 4, 2), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 8, 2), (256, 4, 2), (32, 4, 4)],
         128: [None, (64, 4, 2), (32, 4, 3), (32, 4, 4), (128, 4, 2), (64, 8, 2), (32, 4, 2)]}
for B, Hq, Hkv, D, N in SHAPES:
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)
    base_splits = [2, 4] if B == 8 else [16, 32]
    for tile in TILES[D]:
        dec.decode_tile = shipped if tile is None else (lambda *a, _t=tile, **kw: _t)
        for s in ([None] + base_splits):
            fn = lambda: mta.decode_attention(q, k, v, num_splits=s)
            err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, err
            ev = [min(time_ms(fn, warmup=5, rep=30), time_ms(fn, warmup=2, rep=30)) * 1e3]
            sd = time_ms(sdpa, warmup=2, rep=30) * 1e3
            rows.append(dict(shape=[B, Hq, Hkv, D, N], tile=tile, splits=s, us=ev[0], sdpa_us=sd, err=err))
            print(f"{B}x{Hq}/{Hkv} d{D} N{N} tile {tile} splits {s}: {ev[0]:.1f} us, sdpa {sd:.1f} "
                  f"({ev[0] / sd:.3f})", flush=True)
    dec.decode_tile = shipped
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

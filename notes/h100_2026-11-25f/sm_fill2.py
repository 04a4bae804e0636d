"""Follow-up of sm_fill.py: 128 programs each streaming a whole head (B x H = 16 x 8, one split) against 132
(12 x 11) and 128 programs of half a head (8 x 8, two splits), d = 64, 64k keys, bf16, Nq = 1; SDPA beside."""
import json
import torch
import torch.nn.functional as F
import mta
from mta.bench.timing import time_ms

dev = torch.device("cuda")
rows = []
N, D = 65536, 64
for rnd in range(2):
    for B, H in ((16, 8), (8, 16), (12, 11), (8, 8), (4, 8)):
        q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
        nbytes = 2 * k.numel() * 2
        for label, s in (("decode rule", None), ("decode 1 split", 1), ("decode 2 splits", 2), ("decode 3 splits", 3),
                         ("decode 4 splits", 4), ("sdpa", -1)):
            if s == -1:
                fn = lambda: F.scaled_dot_product_attention(q, k, v)
            else:
                fn = lambda s=s: mta.decode_attention(q, k, v, num_splits=s)
            ms = time_ms(fn, warmup=10, rep=50)
            rows.append(dict(test=label, round=rnd, B=B, H=H, heads=B * H, ms=ms, tbs=nbytes / ms / 1e9))
            print(f"{label:16s} {B}x{H} r{rnd} {ms * 1e3:7.1f} us {nbytes / ms / 1e9:.3f} TB/s", flush=True)
        del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open("sm_fill2.json", "w"), indent=1)

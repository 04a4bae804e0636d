"""Does a decode step's bandwidth depend on how many SMs its programs occupy? At B = 8, Hkv = 8 the split kernel
runs 128 programs (2 splits) on the H100's 132 SMs, one program per SM; 4 splits (256) were no faster.

1. A plain read of 256 MiB (bf16) by P programs, each summing one contiguous chunk through a 3-stage pipelined
   loop: TB/s for P = 128, 132, 256, 264, 512, 528.
2. mta.decode_attention (bf16, Nq = 1, d = 64, Hq = Hkv, 64k keys) at B x H = 8 x 8 (64 heads: 128 programs with
   2 splits) against 6 x 11 and 12 x 11 (66 and 132 heads: 132 and 264 programs), and SDPA on the same: TB/s of
   K and V."""
import json
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import mta
from mta.bench.timing import time_ms


@triton.jit
def read_kernel(X, OUT, chunk, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * chunk
    stop = tl.minimum(start + chunk, n)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.range(start, stop, BLOCK, num_stages=3):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < stop, other=0.0).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


dev = torch.device("cuda")
rows = []
n = 128 * 1024 * 1024  # 256 MiB of bf16
x = torch.randn(n, device=dev, dtype=torch.bfloat16)
for rnd in range(2):
    for p in (128, 132, 256, 264, 512, 528):
        out = torch.empty(p, device=dev, dtype=torch.float32)
        chunk = triton.cdiv(triton.cdiv(n, p), 8192) * 8192
        for block, warps in ((8192, 4), (16384, 8)):
            ms = time_ms(lambda: read_kernel[(p,)](x, out, chunk, n, BLOCK=block, num_warps=warps), warmup=10, rep=50)
            rows.append(dict(test="read", round=rnd, programs=p, block=block, warps=warps, ms=ms,
                             tbs=2 * n / ms / 1e9))
            print(rows[-1], flush=True)
del x
N, D = 65536, 64
for rnd in range(2):
    for B, H in ((8, 8), (6, 11), (12, 11), (4, 33)):
        q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
        nbytes = 2 * k.numel() * 2
        for label, fn in (("decode rule", lambda: mta.decode_attention(q, k, v)),
                          ("decode 1 split", lambda: mta.decode_attention(q, k, v, num_splits=1)),
                          ("decode 2 splits", lambda: mta.decode_attention(q, k, v, num_splits=2)),
                          ("decode 4 splits", lambda: mta.decode_attention(q, k, v, num_splits=4)),
                          ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v))):
            ms = time_ms(fn, warmup=10, rep=50)
            rows.append(dict(test=label, round=rnd, B=B, H=H, heads=B * H, ms=ms, tbs=nbytes / ms / 1e9))
            print(rows[-1], flush=True)
        del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open("sm_fill.json", "w"), indent=1)

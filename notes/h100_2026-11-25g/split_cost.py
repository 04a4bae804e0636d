"""Where 2 splits lose time against 1 in decode_attention (bf16, Nq = 1, d = 64, 64k keys): the step with and
without the merge kernel, with and without programmatic dependent launch, other tiles, and the kernels' own
durations from torch.profiler. SDPA beside."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
rows = []
orig_launch, orig_pdl, orig_tile = dec.launch, dec.dependent_launch, dec.decode_tile


def skip_merge(kernel, grid, *a, **k):
    if kernel is dec.decode_combine_kernel:
        return None
    return orig_launch(kernel, grid, *a, **k)


def run(label, fn, nbytes, B, H, D, N):
    ms = time_ms(fn, warmup=10, rep=50)
    rows.append(dict(test=label, B=B, H=H, D=D, N=N, us=ms * 1e3, tbs=nbytes / ms / 1e9))
    print(f"{label:34s} B{B} H{H} d{D} N{N} {ms * 1e3:7.1f} us {nbytes / ms / 1e9:.3f} TB/s", flush=True)


def shape(B, Hq, Hkv, D, N):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    return q, k, v, 2 * k.numel() * 2


for rnd in range(2):
    for B, Hq, Hkv, D, N in ((16, 8, 8, 64, 65536), (8, 8, 8, 64, 65536), (8, 8, 8, 64, 32768),
                             (8, 32, 8, 128, 32768)):
        q, k, v, nb = shape(B, Hq, Hkv, D, N)
        g = dict(B=B, H=Hq, D=D, N=N)
        run(f"r{rnd} sdpa", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), nb, **g)
        for s in (None, 1, 2):
            run(f"r{rnd} decode s={s}", lambda s=s: mta.decode_attention(q, k, v, num_splits=s), nb, **g)
        dec.launch = skip_merge
        run(f"r{rnd} split kernel only s=2", lambda: mta.decode_attention(q, k, v, num_splits=2), nb, **g)
        dec.launch = orig_launch
        dec.dependent_launch = lambda device: False
        run(f"r{rnd} decode s=2 no PDL", lambda: mta.decode_attention(q, k, v, num_splits=2), nb, **g)
        dec.dependent_launch = orig_pdl
        if rnd == 0:
            for tile in ((128, 4, 4), (256, 4, 3), (256, 8, 2), (64, 4, 4), (128, 8, 3), (64, 2, 4)):
                if D == 128:
                    tile = (tile[0] // 2, tile[1], tile[2])
                dec.decode_tile = lambda bd, dt, tile=tile: tile
                try:
                    run(f"r{rnd} decode s=2 tile {tile}", lambda: mta.decode_attention(q, k, v, num_splits=2), nb, **g)
                except Exception as e:  # out of resources
                    print("tile", tile, type(e).__name__, str(e)[:200])
                dec.decode_tile = orig_tile
        del q, k, v

q, k, v, nb = shape(8, 8, 8, 64, 65536)
for _ in range(5):
    mta.decode_attention(q, k, v, num_splits=2)
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        mta.decode_attention(q, k, v, num_splits=2)
        F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1] if len(sys.argv) > 1 else "split_cost.json", "w"), indent=1)

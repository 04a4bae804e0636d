"""timeline.py found the programs of one split kernel ending over ~18 us at random (not the same SMs from run to
run): the kernel waits for the slowest. Do many short splits (the hardware then hands the next split to whichever
SM is free) end sooner when the merge is left out? Event timing of the split kernel alone and of the whole step,
and kernel times from torch.profiler, for split counts 2-132. bf16, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
orig_launch, orig_tile = dec.launch, dec.decode_tile


def skip_merge(kernel, grid, *a, **k):
    return None if kernel is dec.decode_combine_kernel else orig_launch(kernel, grid, *a, **k)


rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 65536), (8, 32, 8, 128, 32768)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    sd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), warmup=5, rep=40) * 1e3
    print(f"B{B} Hq{Hq} d{D} N{N}: sdpa {sd:.1f} us", flush=True)
    base = orig_tile(D, torch.bfloat16)
    for tile in (base, base[:2] + (2,)):
        dec.decode_tile = lambda bd, dt, tile=tile: tile
        for s in (2, 4, 8, 16, 33, 66, 132):
            fn = lambda s=s: mta.decode_attention(q, k, v, num_splits=s)
            step = time_ms(fn, warmup=5, rep=40) * 1e3
            dec.launch = skip_merge
            alone = time_ms(fn, warmup=5, rep=40) * 1e3
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            dec.launch = orig_launch
            kern = [e.device_time for e in prof.key_averages() if e.key == "decode_split_kernel"][0]
            rows.append(dict(B=B, Hq=Hq, D=D, N=N, tile=tile, splits=s, step_us=step, split_kernel_event_us=alone,
                             split_kernel_profiler_us=kern, sdpa_us=sd))
            print(f"  {tile} s={s:3d}: step {step:6.1f}  split kernel alone {alone:6.1f} (profiler {kern:6.1f}) us",
                  flush=True)
    dec.decode_tile = orig_tile
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

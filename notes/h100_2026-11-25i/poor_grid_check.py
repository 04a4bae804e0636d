# [BATCHES=24,40,...] python notes/h100_2026-11-25i/poor_grid_check.py OUT.json   (GPU; from the repository root)
"""decode_attention with the poor-grid rule (two splits at 2k-8k keys, the even deal from 8k, where the units leave
fewer programs than SMs past full rounds of resident programs, or fill one program an SM's last wave unevenly)
against the rule before it (resident programs taken as 1, no two splits), beside SDPA. bf16, Nq = 1, event timing,
best of two rounds. Also the split kernel's registers and shared memory as compiled (what resident_programs
estimates)."""
import json
import os
import sys

import torch
import torch.nn.functional as F

import mta
import mta.decode as dec
from mta.bench.timing import time_ms

dev = torch.device("cuda")
new_resident, new_two = dec.resident_programs, dec.two_splits_for_a_poor_grid
launched = []
orig_launch = dec.launch


def recording_launch(kernel, grid, *args, **kw):
    launched.append((kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), tuple(grid)))
    return orig_launch(kernel, grid, *args, **kw)


dec.launch = recording_launch


def use(new):
    dec.resident_programs = new_resident if new else (lambda *a: 1)
    dec.two_splits_for_a_poor_grid = new_two if new else (lambda *a: False)


rows = []
for Hq, Hkv, D in ((8, 8, 64), (32, 8, 128)):
    for B in map(int, os.environ.get("BATCHES", "24,40,64,65,66,80").split(",")):
        for N in (2048, 4096, 8192, 16384):
            torch.manual_seed(0)
            q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
            paths = {}
            for new in (True, False):
                use(new)
                launched.clear()
                err = ((mta.decode_attention(q, k, v).float() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, err
                paths["rule" if new else "old"] = launched[0]
            del ref
            best = {}
            for rnd in range(2):
                for name in ("sdpa", "rule", "old"):
                    if name == "sdpa":
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)
                    else:
                        use(name == "rule")
                        fn = lambda: mta.decode_attention(q, k, v)
                    best[name] = min(best.get(name, 9e9), time_ms(fn, warmup=5, rep=30))
            use(True)
            sd = best["sdpa"]
            rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, paths=paths, **{f"{n}_us": t * 1e3 for n, t in best.items()}))
            print(f"B{B:3d} d{D:3d} N{N:6d}  sdpa {sd * 1e3:7.1f} us  rule {best['rule'] * 1e3:7.1f} ({sd / best['rule']:.3f}x)"
                  f"  old {best['old'] * 1e3:7.1f} ({sd / best['old']:.3f}x)  {paths['rule']} / {paths['old']}", flush=True)
            del q, k, v
occ = []
for kern in (dec.decode_split_kernel, dec.decode_stream_kernel):
    for cache in kern.device_caches.values():
        for ck in cache[0].values():
            try:
                ck._init_handles()
                occ.append((kern.fn.__name__, ck.n_regs, ck.metadata.shared, ck.metadata.num_warps,
                            ck.metadata.num_stages, {str(k): v for k, v in ck.src.constants.items() if isinstance(k, tuple)}
                            if hasattr(ck, "src") else None))
            except Exception as e:  # noqa: BLE001
                occ.append(repr(e)[:200])
for o in occ:
    print(o)
print("shared per SM", torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor)
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows, compiled=occ), open(sys.argv[1], "w"), indent=1,
          default=str)

"""Split counts between one and two programs an SM. The rule gives one split once batch x kv heads reaches 80% of
the SMs; at 136 (batch, head) pairs (32k keys) that was 3% slower than cuDNN and 5% over linear in the bytes
(`sm_count.log`). Batches 12-40 on 8 kv heads, splits 1-4 and the rule's, SDPA beside; event timing, bf16, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
from mta.bench.timing import time_ms

dev = torch.device("cuda")
rows = []
for Hq, D, N, batches in ((8, 64, 32768, (12, 16, 17, 20, 24, 28, 32, 33, 40)), (8, 64, 8192, (17, 20, 24, 32)),
                          (32, 128, 16384, (17, 20, 24, 32))):
    for B in batches:
        q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, 8, N, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, 8, N, D, device=dev, dtype=torch.bfloat16)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != 8)
        line = {}
        for s in (None, 1, 2, 3, 4, "sdpa"):
            fn = sdpa if s == "sdpa" else (lambda: mta.decode_attention(q, k, v, num_splits=s))
            line[str(s)] = min(time_ms(fn, warmup=5, rep=30), time_ms(fn, warmup=2, rep=30)) * 1e3
        rows.append(dict(B=B, Hq=Hq, Hkv=8, D=D, N=N, us=line))
        best = min((v, k) for k, v in line.items() if k not in ("None", "sdpa"))
        print(f"B {B:2d} ({B * 8} pairs) Hq {Hq} d {D} N {N}: " + " ".join(f"{k}:{v:.1f}" for k, v in line.items())
              + f"  rule/sdpa {line['None'] / line['sdpa']:.3f}, best {best[1]} {best[0] / line['sdpa']:.3f}", flush=True)
        del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

"""What launch does cuDNN's decode (SDPA, one query) make at the B = 8 shapes where it leads? The kineto trace of
torch.profiler records each kernel's grid, block, registers and shared memory. Ours beside. bf16, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import mta

dev = torch.device("cuda")
rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 65536), (8, 8, 8, 64, 32768), (8, 32, 8, 128, 32768), (16, 8, 8, 64, 32768),
                          (1, 8, 8, 64, 65536), (4, 8, 8, 64, 131072)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    for name, fn in (("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)),
                     ("decode", lambda: mta.decode_attention(q, k, v))):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        path = f"/tmp/trace_{name}_{B}_{Hq}_{D}_{N}.json"
        prof.export_chrome_trace(path)
        for e in json.load(open(path))["traceEvents"]:
            if e.get("cat") == "kernel":
                a = e.get("args", {})
                row = dict(shape=[B, Hq, Hkv, D, N], impl=name, kernel=e["name"][:90], dur_us=e.get("dur"),
                           grid=a.get("grid"), block=a.get("block"), regs=a.get("registers per thread"),
                           smem=a.get("shared memory"), blocks_per_sm=a.get("blocks per SM"),
                           warps_per_sm=a.get("warps per SM"), occupancy=a.get("est. achieved occupancy %"))
                rows.append(row)
                print(row, flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

"""The flash forward at d = 128, not causal, N = 4k and 8k (the bench's B = 16384 / N, H = 16), where the flash
bench's ratios moved by 3-9% between runs of the same kernel: the table's tile against its neighbours, beside SDPA's
flash and cuDNN backends, inputs requiring grad as in the bench; three interleaved rounds, each median reported.

    PYTHONPATH=. OUT=. python notes/h100_remeasure_2026-11-23/flash_fwd_d128_tiles.py
"""
import json
import os

import torch

from mta.bench.flash import sdpa_with
from mta.bench.timing import time_ms
from mta.flash import flash_forward

TILES = [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (64, 128, 4, 3), (128, 128, 4, 3)]
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for dtype in (torch.float16, torch.bfloat16):
    for N in (4096, 8192):
        dims = (16384 // N, 16, N, 128)
        q, k, v = (torch.randn(dims, dtype=dtype, device="cuda").requires_grad_() for _ in range(3))
        variants = {"sdpa_flash": lambda: sdpa_with("FLASH_ATTENTION")(q, k, v, False),
                    "sdpa_cudnn": lambda: sdpa_with("CUDNN_ATTENTION")(q, k, v, False)}
        for bm, bn, w, s in TILES:
            variants[f"{bm}x{bn} w{w} s{s}"] = (lambda bm=bm, bn=bn, w=w, s=s: flash_forward(
                q, k, v, False, 128 ** -0.5, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s))
        ms = {name: [] for name in variants}
        for rnd in range(3):
            for name, fn in variants.items():
                ms[name].append(time_ms(fn, rep=40))
        print(dtype, N, {k: [round(t, 3) for t in v] for k, v in ms.items()}, flush=True)
        out["rows"].append({"dtype": str(dtype), "N": N, "ms": ms})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "flash_fwd_d128_tiles.json"), "w"), indent=1)

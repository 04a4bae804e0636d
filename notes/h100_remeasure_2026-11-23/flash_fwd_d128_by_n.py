"""The flash forward at d = 128, not causal: 128 x 128 (the table's) against 128 x 64 at every bench length
(B = 16384 / N, H = 16), fp16 and bf16, inputs requiring grad as in the bench; three interleaved rounds.

    PYTHONPATH=. OUT=. python notes/h100_remeasure_2026-11-23/flash_fwd_d128_by_n.py
"""
import json
import os

import torch

from mta.flash import flash_forward

TILES = [(128, 128, 8, 3), (128, 64, 8, 3)]
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
from mta.bench.timing import time_ms  # noqa: E402
for dtype in (torch.float16, torch.bfloat16):
    for N in (1024, 2048, 4096, 8192, 16384):
        dims = (16384 // N, 16, N, 128)
        q, k, v = (torch.randn(dims, dtype=dtype, device="cuda").requires_grad_() for _ in range(3))
        ms = {f"{bm}x{bn}": [] for bm, bn, _, _ in TILES}
        for rnd in range(3):
            for bm, bn, w, s in TILES:
                ms[f"{bm}x{bn}"].append(time_ms(lambda: flash_forward(q, k, v, False, 128 ** -0.5, BLOCK_M=bm,
                                                                      BLOCK_N=bn, num_warps=w, num_stages=s),
                                                rep=40))
        print(dtype, N, {k: [round(t, 3) for t in v] for k, v in ms.items()}, flush=True)
        out["rows"].append({"dtype": str(dtype), "N": N, "ms": ms})
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "flash_fwd_d128_by_n.json"), "w"), indent=1)
